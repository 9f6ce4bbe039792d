"""The contract between the run driver and an operation.

The driver owns the pipeline (config -> input -> partition -> distribute -> compute -> gather ->
verify -> record); an operation fills in the steps. Every method marked *collective* is called on
all ranks in the same order; the others on rank 0 only.
"""
import importlib
from dataclasses import dataclass

import numpy as np

from ..layout import WholeOnRoot, layout_of

#: What a phase is, declared by each operation and written to the results file (``phase_kind``)
#: so that ``hisparse report`` never guesses from names. ``detail`` is time already inside
#: another phase (e.g. the kernel launches within a chunked ``compute``): shown, never summed.
PHASE_KINDS = ("io", "setup", "transfer", "communication", "compute", "collect", "detail",
               "total")


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
    SETUP_PHASES, REPEAT_PHASES : dict of str -> str
        Phases this operation records once, and in each repeat, with their kind (one of
        :data:`PHASE_KINDS`); ``read`` and ``total`` are the driver's.
    COMPUTE_PHASES : tuple of str
        Phases whose sum is "compute time" for GFLOP/s, GB/s and peer speedups: by default the
        repeat phases of kind ``compute``.
    DEFAULT_RTOL : dict
        Verification tolerance per precision when ``verify.rtol`` is null.
    DEVICE_COLLECTIVES : bool
        The operation moves device buffers between ranks (planned collectives on GPU arrays,
        the nonzeros' routing on NCCL). When False, ``parallel.transport: auto`` picks MPI for
        it: its collectives all move host buffers, and an NCCL communicator would only add its
        set-up to the time to solution.
    NCCL_CHANNELS : int or None
        The channels its NCCL communicator may use under ``parallel.nccl_channels: auto``
        (None: the transport's default, :data:`~hisparse.parallel._nccl.AUTO_NCCL_CHANNELS`).
        NCCL connects each pair of ranks on every channel at first use; an operation whose
        exchanges are small needs few.
    """

    NAME = "?"
    INPUT_KIND = "matrix"
    PARAMS = {}
    PARTITIONS = ()
    PEERS = ()
    SETUP_PHASES = {"partition": "setup", "distribute": "communication"}
    REPEAT_PHASES = {"h2d": "transfer", "kernel": "compute", "d2h": "transfer",
                     "gather": "communication"}
    COMPUTE_PHASES = ("kernel",)
    DEFAULT_RTOL = {"fp64": 1e-12, "fp32": 1e-4}
    DEVICE_COLLECTIVES = True
    NCCL_CHANNELS = None
    #: The ``output.collect`` modes :meth:`collect` handles itself. For any other mode the
    #: driver decides: ``parts`` still calls :meth:`collect` (rank 0 verifies what it gathers)
    #: and writes :meth:`local_result_arrays`; ``none`` skips an overridden :meth:`collect`
    #: (nothing reaches rank 0, verification is skipped).
    COLLECT_MODES = ("gather",)
    #: Whether :meth:`collect` brings a result that stays distributed over the ranks to rank 0
    #: (``output.collect: none`` then skips it, unless ``none`` is one of COLLECT_MODES).
    GATHERS_RESULT = False
    #: Whether :meth:`local_result_arrays` gives each rank's part of the result
    #: (``output.collect: parts``).
    WRITES_PARTS = False
    #: Whether :meth:`setup` calls :meth:`connected` itself, right before its first collective
    #: on device buffers, so that the device transport's connection (made on a thread since the
    #: run's start) goes on under the plan and upload too; otherwise the driver waits for it
    #: once the input is read. Either way the driver calls it again after the setup.
    CONNECTS_IN_SETUP = False
    #: ``parallel.connect_early: auto``: whether the device transport's set-up thread also makes
    #: NCCL's connections to every peer, while the input is read and planned, rather than
    #: leaving them to the operation's first exchange. Worth it where the read and plan outlast
    #: them; where they do not, the run waits for them at ``connect`` instead (CP-ALS at 4
    #: ranks, stop 38: ``connect`` 0.01 -> 0.85 s, time to solution 3.74 -> 3.82 s).
    CONNECT_EARLY = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for attr in ("SETUP_PHASES", "REPEAT_PHASES"):
            declared = getattr(cls, attr)
            if not isinstance(declared, dict):
                raise TypeError(f"{cls.__name__}.{attr} must map phase name -> kind")
            for name, kind in declared.items():
                if kind not in PHASE_KINDS:
                    raise TypeError(f"{cls.__name__}.{attr}['{name}']: kind '{kind}' is not one "
                                    f"of {PHASE_KINDS}")
        if "COMPUTE_PHASES" not in cls.__dict__:
            cls.COMPUTE_PHASES = tuple(n for n, k in cls.REPEAT_PHASES.items() if k == "compute")

    def __init__(self, ctx):
        self.ctx = ctx
        self.params = ctx.config["operation.params"]
        strategy = ctx.config["partition.strategy"]
        self.strategy = self.auto_strategy(ctx.size) if strategy == "auto" and self.PARTITIONS \
            else strategy

    @classmethod
    def auto_strategy(cls, nranks):
        """The strategy ``partition.strategy: auto`` stands for at ``nranks`` ranks as far as the
        config and the rank count tell (``hisparse run --dry-run`` prints it; an operation may
        refine it once it sees its input): the first of :attr:`PARTITIONS` unless the operation
        says otherwise."""
        return cls.PARTITIONS[0]

    def connected(self):
        """Wait until the run's transport is connected (an NCCL communicator joined on its own
        thread: 0.5-0.9 s at 2 ranks, which a short read does not hide), timed as ``connect``;
        at once when it is. *Collective*: a rank whose connection failed fails every rank here,
        before any of them waits in a device collective."""
        from ..parallel import all_call
        ctx = self.ctx
        with ctx.timer.phase("connect"):
            all_call(ctx.comm, ctx.transport.ready)

    def before_read(self):
        """Start what the read can hide (a thread loading compiled code the setup will run);
        called on every rank just before the input is read. Default nothing."""

    @classmethod
    def modules_for_setup(cls, config, nranks):
        """Names of the modules the GPU backend's setup of this run will import (CuPy, where a
        format is built on the device), for the driver to import before it binds the GPU, while
        CUDA initialises in the background. Only a hint: the setup imports what it needs
        anyway. Default none."""
        return ()

    @classmethod
    def phases(cls):
        """Every phase, in record order: the driver's ``startup`` (the process's launch to the run's
        first phase: interpreter, imports, MPI, config, GPU binding; recorded by ``hisparse
        run``), ``connect`` (the transport's set-up: the NCCL communicator) and ``read``, the setup
        phases, the driver's ``prepare`` (the rest of the set-up's wall time, outside the setup
        phases: loading kernels and compiled code, waits), the repeat phases, the driver's
        ``collect`` (after the repeats) and ``total`` (per repeat)."""
        return ("startup", "connect", "read") + tuple(cls.SETUP_PHASES) + ("prepare",) + \
            tuple(cls.REPEAT_PHASES) + ("collect", "total")

    @classmethod
    def phase_kinds(cls):
        """``{phase: kind}`` for every phase of :meth:`phases`, in order."""
        return {"startup": "startup", "connect": "communication", "read": "io", **cls.SETUP_PHASES,
                "prepare": "setup", **cls.REPEAT_PHASES, "collect": "collect", "total": "total"}

    @classmethod
    def phase_scopes(cls):
        """``{phase: "setup" | "repeat" | "after"}``: recorded once before the repeats, in every
        repeat, or once after them (``collect``)."""
        scopes = {"startup": "setup", "connect": "setup", "read": "setup", "prepare": "setup"}
        scopes.update({name: "setup" for name in cls.SETUP_PHASES})
        scopes.update({name: "repeat" for name in cls.REPEAT_PHASES})
        scopes.update(collect="after", total="repeat")
        return scopes

    def layout(self):
        """How this run's input is read and spread over the ranks: a :mod:`hisparse.layout`
        object, whose ``load`` is the driver's ``read`` phase and whose ``distribute`` is
        :meth:`distribute`'s. The default, :class:`~hisparse.layout.WholeOnRoot`, reads the whole
        input on rank 0 and splits it there with :meth:`partition`; an operation that reads by
        parts returns its own (:class:`~hisparse.layout.RowLayout`,
        :class:`~hisparse.layout.TensorGridLayout`, ...). Built from :attr:`strategy` and
        :attr:`params` alone (hooks it names are called later, by the layout): the memory
        estimate asks for it before the run has a context (:meth:`reads_input_by_parts`).
        *Every rank*; the same layout on every rank."""
        return WholeOnRoot(self.INPUT_KIND)

    def pick_engine(self, local, variant=None):
        """The engine of this rank's backend for ``local`` data: ``ENGINES[variant]`` of the
        operation package's ``cpu`` or ``gpu`` module (the GPU module is imported only here, so
        a CPU run never imports PyCUDA)."""
        return pick_engine(self, local, variant)

    def engine_stats(self):
        """Per-rank engine figures for ``/perf`` (peak device bytes, ...)."""
        engine = getattr(self, "engine", None)
        return engine.memory_stats() if isinstance(engine, Engine) else {}

    @classmethod
    def estimate_memory(cls, config, header, nranks):
        """A lower bound of what the busiest rank of this run allocates, from the config and the
        input's header alone (nothing read), for the check before the run and ``hisparse run
        --dry-run`` (:mod:`hisparse.estimate`).

        Parameters
        ----------
        config : Config
        header : hisparse.estimate.InputHeader
            The input's shape, nonzeros and the run's index and value sizes.
        nranks : int

        Returns
        -------
        MemoryEstimate
            Bytes per config key that makes them, on the host and on the device. The default:
            the rank's part of the input (rank 0 holds the whole input first when the input is
            not read by parts), and one result value per row (matrix) or nonzero (tensor) of
            a matrix's part (a tensor operation's result is sized by its own parameters).
            Operations add what their parameters size (vectors, factors, right-hand sides).
        """
        estimate = MemoryEstimate().add(header.key, header.part_bytes(nranks))
        if not cls.reads_input_by_parts(config):
            estimate.add(header.key, header.part_bytes(1), device=0, root_only=True)
        if header.kind == "matrix":
            estimate.add("result", header.part_rows(nranks) * header.value_bytes)
        return estimate

    @classmethod
    def reads_input_by_parts(cls, config):
        """Whether every rank reads (or generates) only its own part of the input under
        ``config``: the ``BY_PARTS`` of its :meth:`layout`, asked before the run of an operation
        that holds only ``config``'s parameters and strategy."""
        planned = cls.__new__(cls)
        Operation.__init__(planned, _ConfigOnly(config))
        return planned.layout().BY_PARTS

    # -- collective steps -------------------------------------------------------------------
    def setup(self, problem):
        """Partition ``problem`` (rank 0; ``None`` elsewhere), distribute, and build the local
        plan and device buffers. *Collective.*"""
        raise NotImplementedError

    def distribute(self, problem):
        """This rank's part of ``problem`` and the data every rank gets, by the layout the input
        was read by (:func:`~hisparse.layout.layout_of`: this operation's :meth:`layout` for a
        problem read by parts, else the whole input on rank 0, split by :meth:`partition` and
        scattered). Timed as the phases ``partition`` and ``distribute``. *Collective.*

        Returns
        -------
        part : dict
            This rank's arrays and scalars, the same whichever layout read the input (read by
            rows: ``indptr``, ``indices``, ``data`` in the run's index and value dtypes, ``rows``
            as int64 global ids, ``ncols``, ``nrows``, as SpMV/SpGEMM's :meth:`partition` give
            them).
        shared : dict or None
            The data every rank receives (e.g. the vector x, the matrix B, initial factors).
        """
        return layout_of(self, problem).distribute(self, problem)

    def shared_data(self, part):
        """Input read by parts (a :class:`~hisparse.layout.RowLayout` or
        :class:`~hisparse.layout.TensorGridLayout`): the data every rank needs beside its part
        (the ``shared`` of :meth:`partition`), made on every rank instead of broadcast from rank
        0 -- e.g. SpGEMM's B read by every rank, SpTV's v. *Collective* (every rank calls it,
        with its own ``part``); the default shares nothing."""
        return {}

    def partition(self, problem):
        """The whole input on rank 0 (:class:`~hisparse.layout.WholeOnRoot`): split ``problem``
        for the ranks: ``(parts, shared)``, a list of ``comm.size`` dicts of arrays and scalars,
        and one dict for every rank (or ``None``). *Rank 0.*"""
        raise NotImplementedError

    def run_once(self):
        """One timed repetition of the operation, ending with the result gathered on rank 0.
        *Collective.*"""
        raise NotImplementedError

    def collect(self):
        """After the timed repeats: bring a result that stayed distributed (on the ranks' GPUs)
        to where verification and the results file need it. Timed as phase ``collect``, outside
        the per-repeat total. *Collective.* The default does nothing: operations that gather in
        every repeat have nothing left to collect."""

    def local_result_arrays(self):
        """``output.collect: parts``: this rank's part of each ``/result`` array, called on every
        rank after :meth:`collect` and before :meth:`teardown`.

        Returns
        -------
        dict of str -> (ndarray, ndarray or None), or None
            ``{name: (part, global_rows)}``: ``global_rows`` (int64, ascending) are the rows of
            the whole array that the part's rows are, or ``None`` when the ranks' parts follow
            each other in rank order. ``None`` (the default): the operation cannot write parts,
            and a run asking for them stops before reading its input.
        """
        return None

    @classmethod
    def files_written(cls, params):
        """``[(key, path, schema)]``: the files besides the results that a run with these
        ``operation.params`` writes, checked before its input is read
        (:func:`~hisparse.io.plan_written_file`); ``schema`` is that of an existing file the
        run may replace (its own kind), or None. Default none."""
        return []

    @classmethod
    def writes_parts(cls):
        """Whether each rank writes its part of the result (``output.collect: parts``)."""
        return cls.WRITES_PARTS

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


@dataclass
class _ConfigOnly:
    """What :meth:`Operation.reads_input_by_parts` gives an operation before the run: the config
    (the context's other members do not exist yet; its size, unknown, counts as one rank)."""

    config: object
    size: int = 1


class MemoryEstimate:
    """Bytes one rank will allocate, by the config key that makes them (``input.path``,
    ``operation.params.nrhs``, ...), on the host and on the device: what
    :meth:`Operation.estimate_memory` returns."""

    def __init__(self):
        self.host, self.device = {}, {}
        #: the host bytes of :attr:`host` that rank 0 alone holds (the others do not)
        self.root_only = 0
        #: what the bytes leave out that the run may need most (``hisparse run --dry-run``
        #: prints them): Cholesky's factor, known only after its analysis
        self.notes = []

    def add(self, key, host, device=None, root_only=False):
        """Add ``host`` bytes (and ``device`` bytes, default the same: a GPU run holds its
        arrays on both) made by ``key``; ``root_only``: held by rank 0 alone."""
        device = host if device is None else device
        self.host[key] = self.host.get(key, 0) + int(host)
        self.device[key] = self.device.get(key, 0) + int(device)
        if root_only:
            self.root_only += int(host)
        return self

    def note(self, text):
        """Add a line saying what the estimate cannot count."""
        self.notes.append(text)
        return self

    def node_host_bytes(self, ranks_on_node):
        """Host bytes of ``ranks_on_node`` ranks together, rank 0 among them."""
        host = sum(self.host.values())
        return (host - self.root_only) * ranks_on_node + self.root_only


class Engine:
    """Base of every engine: the compute of one operation on one rank's local data.

    An engine takes local arrays and returns local arrays; it never sees a communicator (the
    operation composes engine steps with the planned collectives of :mod:`hisparse.parallel`).

    Parameters
    ----------
    ctx : EngineContext
        Timer, config, device and kernel loading of this rank; no communicator.
    local : object
        The operation's local data (its own type: a CSR block, a fiber plan, mode unfoldings...).
    params : dict
        ``operation.params``.
    """

    BACKEND = "cpu"

    def __init__(self, ctx, local, params):
        self.ctx, self.local, self.params = ctx, local, params
        self.arena = None

    def free(self):
        """Release what the engine holds (device memory through its arena)."""
        if self.arena is not None:
            self.arena.release_all()

    def memory_stats(self):
        """Per-rank figures for ``/perf``: ``peak_device_bytes`` (0 on the CPU)."""
        if self.arena is None:
            return {"peak_device_bytes": 0}
        return self.arena.stats()


class GpuEngine(Engine):
    """An engine on this rank's GPU: every device allocation goes through ``self.arena``, so the
    operation's peak device bytes are recorded."""

    BACKEND = "gpu"

    def __init__(self, ctx, local, params, owner="hisparse"):
        super().__init__(ctx, local, params)
        from ..gpu import DeviceArena
        self.arena = DeviceArena(owner=owner)


def pick_engine(op, local, variant=None):
    """Instantiate ``ENGINES[variant]`` from ``<op package>.<backend>`` (see
    :meth:`Operation.pick_engine`)."""
    package = type(op).__module__.rpartition(".")[0]
    module = importlib.import_module(f"{package}.{op.ctx.backend}")
    engines = module.ENGINES
    if variant not in engines:
        raise KeyError(f"{package}.{op.ctx.backend} has no engine for {variant!r} "
                       f"(has {sorted(map(str, engines))})")
    return engines[variant](op.ctx.engine_context(), local, op.params)
