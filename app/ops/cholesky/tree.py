"""Strategy ``subtree``'s exchanges along the elimination tree: one rank's side of them, a
:class:`SubtreeExchange` that the operation (:mod:`.op`) makes in its ``distribute``.

Every rank factors its subtrees alone (:mod:`.mapping` maps whole subtrees of the supernodal
elimination tree to the ranks, balanced by flops); then the top supernodes (the separators above
the ranks' subtrees, cut into pieces dealt to the ranks below them) are factored in postorder by
their owners, each after the update blocks of the other ranks holding its descendants have come
in (``numeric``, :meth:`SubtreeExchange.factor`); the solve goes up the tree the same way (solve
blocks of the top supernodes' columns to their owners) and back down (the owners' solved blocks to
the ranks below) (``solve``, :meth:`SubtreeExchange.solve`; the corrections of the iterative
refinement are solved the same way). With CUDA IPC (GPU, every rank on one node) an owner's GPU
reads the blocks straight from the other GPUs' memory and only where each lies moves over MPI.
The solution stays on the ranks until ``collect`` gathers it to rank 0, once
(:meth:`SubtreeExchange.gather_solution`). log det A is the sum of the ranks' shares.

Why a module of its own: the engines never see a communicator (the engine,
:class:`~.cpu.SubtreeFactorEngine` or :class:`~.gpu.GpuSubtreeEngine`, hands out and takes in the
blocks), and the operation plans, sets up and times the phases; the moving of blocks between the
ranks, with what it needs (the rank's plan, the runs of top supernodes it holds, its engine,
whether CUDA IPC is used) and the per-rank split of the phases it runs, is here.
"""
import numpy as np

from ...parallel import (gather_arrays, isend_array, min_over_ranks, recv_array_into, root_call,
                         wait_requests)
from ...timing import StepClock
from .cpu import NotPositiveDefinite
from .rank_plan import TopUpdates

#: MPI tag of strategy subtree's update and solve blocks.
EXCHANGE_TAG = 7411

#: The steps of a rank's ``numeric`` phase under strategy subtree, recorded per rank as
#: ``chol_<step>_seconds``: its subtrees, its top supernodes, the rest (moving, adding and
#: waiting for the update blocks).
NUMERIC_STEPS = ("subtree", "top", "exchange")


class SubtreeExchange:
    """One rank's exchanges of update and solve blocks along the elimination tree (strategy
    ``subtree``), and the gather of the solution.

    Parameters
    ----------
    ctx : hisparse.context.RunContext
        The run's: its communicator and rank, its backend, its log.
    plan : LocalPlan
        This rank's share of the numeric plan (:func:`~.rank_plan.complete_plan`).
    holders : list of numpy.ndarray
        The ranks holding each top supernode (:attr:`~.mapping.SubtreeMap.holders`).
    chains, solve_chains : numpy.ndarray
        The runs of top supernodes (:attr:`~.mapping.SubtreeMap.chains` and ``solve_chains``).
    perm : numpy.ndarray or None
        Rank 0: the fill-reducing ordering (a pivot that fails is named in the original
        numbering; the gathered solution is put back in it); ``None`` elsewhere.
    rank_columns : list of numpy.ndarray or None
        Rank 0: every rank's owned columns (where its rows of the solution go); ``None``
        elsewhere.
    nrhs : int
        The right-hand sides solved together.

    Attributes
    ----------
    engine : SubtreeFactorEngine or GpuSubtreeEngine
        The rank's engine, from :meth:`connect` on.
    ipc : bool
        Whether the blocks are read through CUDA IPC (:meth:`connect`).
    numeric_split : list
        :data:`NUMERIC_STEPS`' seconds, one row per factorization.
    solve_split : list
        Seconds of the rank's subtrees, one per distributed solve.
    """

    def __init__(self, ctx, plan, holders, chains, solve_chains, perm, rank_columns, nrhs):
        self.ctx, self.comm, self.rank = ctx, ctx.comm, ctx.rank
        self.plan, self.holders = plan, holders
        self.chains, self.solve_chains = chains, solve_chains
        self.perm, self.rank_columns, self.nrhs = perm, rank_columns, nrhs
        self.engine, self.ipc = None, False
        self.numeric_split = []  # NUMERIC_STEPS' seconds, one row per factorization
        self.solve_split = []  # seconds of the rank's subtrees, one per distributed solve

    def ipc_wanted(self, requested):
        """Whether the update blocks are read through CUDA IPC: ``requested`` (the operation's
        ``subtree_exchange``) ``ipc`` or ``auto`` on the GPU with every rank on one node (its
        node-local communicator is the whole run's)."""
        ctx = self.ctx
        if ctx.backend != "gpu" or requested == "host":
            return False
        if ctx.local_comm.size != ctx.comm.size:  # the same answer on every rank
            if requested == "ipc":
                ctx.log("cholesky: subtree_exchange 'ipc' needs every rank on one node; the "
                        "update blocks go through the host")
            return False
        return True

    def connect(self, engine, ipc):
        """Take the rank's engine, built for ``ipc`` (:meth:`ipc_wanted`); with ``ipc``, every
        rank maps its peers' panels (:meth:`_open_ipc`; where one cannot, the blocks go through
        the host and :attr:`ipc` is false). *Collective.*"""
        self.engine = engine
        self.ipc = ipc
        if self.ipc:
            self.ipc = self._open_ipc()

    def _open_ipc(self):
        """Every owner of a run maps the panel arrays of the ranks that send it blocks; returns
        whether every rank could. Where one could not (GPUs of one node without peer access:
        CUDA refuses the mapping), every rank unmaps and the blocks go through the host (the
        engine makes its staging buffers at their first use). *Collective.*"""
        ctx = self.ctx
        handles = ctx.comm.allgather(self.engine.ipc_handle())
        senders = {int(source) for _, _, owner, holders in self.tops()
                   if owner == ctx.rank for source in holders if source != ctx.rank}
        reason = None
        try:
            ctx.maybe_fail("ipc")
            self.engine.open_peers({r: handles[r] for r in sorted(senders)})
        except Exception as exc:  # noqa: BLE001 - CUDA's refusal; every rank falls back
            reason = f"rank {ctx.rank}: {type(exc).__name__}: {exc}"
        reasons = [r for r in ctx.comm.allgather(reason) if r is not None]
        if not reasons:
            return True
        self.engine.close_peers()
        if ctx.is_root:
            ctx.log(f"cholesky: the GPUs' memory could not be mapped through CUDA IPC "
                    f"({reasons[0]}); the update blocks go through the host")
        return False

    def tops(self, chains=None):
        """(first and last local id, owner, holders) of every run of top supernodes this rank
        holds (:attr:`~.mapping.SubtreeMap.chains`, or ``chains``: the owner is then its last
        supernode's), in postorder."""
        plan = self.plan
        chains = self.chains if chains is None else chains
        return [(int(plan.top[k0]), int(plan.top[k1]), int(plan.top_owner[k1]), self.holders[k0])
                for k0, k1 in chains if plan.top[k0] >= 0]

    def _solve_tops(self):
        """The runs the solve goes by: with CUDA IPC, every chain of top supernodes with the same
        holders (:attr:`~.mapping.SubtreeMap.solve_chains`; :meth:`_take_factored_pieces`
        brought its pieces to one rank), else the factorization's runs."""
        return self.tops(self.solve_chains) if self.ipc else self.tops()

    def _take_factored_pieces(self):
        """With CUDA IPC, after the factorization: the owner of every solve run's last supernode
        copies the factored panels of the run's other supernodes from their owners' memory, so
        it solves the whole run (their owners send where each lies, as for the blocks)."""
        comm, rank, plan, engine = self.comm, self.rank, self.plan, self.engine
        requests = []
        for k0, k1 in self.solve_chains:
            solver = int(plan.top_owner[k1])
            for k in range(int(k0), int(k1) + 1):
                owner, i = int(plan.top_owner[k]), int(plan.top[k])
                if owner == solver or i < 0:
                    continue
                if rank == owner:
                    requests += isend_array(comm, engine.update_range(i, i), solver,
                                            EXCHANGE_TAG)
                elif rank == solver:
                    where = recv_array_into(comm, np.empty(2, dtype=np.int64), owner,
                                            EXCHANGE_TAG)
                    engine.copy_peer_panels(i, i, where, owner)
        engine.synchronize()
        wait_requests(requests)

    def _gather_up(self, block, empty, take, tops, step, prepare=lambda i: None):
        """Up the tree: for every run of top supernodes, the other holders send ``block(i0,
        i1)`` to its owner, which receives them into ``empty(i0, i1)``, adds them (``take(i0,
        i1, block, source)``, in rank order) and runs ``step(i)`` on each of the run.
        ``prepare(i)`` runs on every holder for each supernode of the run before its block is
        sent or it is stepped."""
        comm, rank = self.comm, self.rank
        requests = []
        for i0, i1, owner, holders in tops:
            if owner != rank:
                for i in range(i0, i1 + 1):
                    prepare(i)
                requests += isend_array(comm, block(i0, i1), owner, EXCHANGE_TAG)
                continue
            for source in holders:
                if source != rank:
                    take(i0, i1, recv_array_into(comm, empty(i0, i1), int(source), EXCHANGE_TAG),
                         int(source))
            for i in range(i0, i1 + 1):
                prepare(i)
                step(i)
        wait_requests(requests)

    def factor(self):
        """Every rank's subtrees, then the top supernodes; returns log det A (rank 0).

        The top supernodes are left-looking (:class:`~.rank_plan.TopUpdates`): a rank applies its
        own top supernodes' updates to a panel just before it sends that block or factors it,
        so a separator cut into pieces dealt to several ranks runs as a pipeline (the next
        piece's update first, the rest while its owner factors it).

        Raises
        ------
        NotPositiveDefinite (as a collective error, on every rank)
        """
        engine, comm = self.engine, self.comm
        # This rank's split of the phase (its subtrees, its top supernodes, the rest: moving
        # and adding the update blocks, waiting for them); every step ends in a stream
        # synchronize. Recorded per rank (rank_info), so the limit is visible.
        clock = StepClock()
        failed = [engine.factor_local()]
        clock.mark("subtree")
        updates = TopUpdates(self.plan)

        def apply_updates(i):
            due = updates.due(i)
            if failed[0] < 0 and due:
                clock.mark("exchange")
                for source, r0, r1 in due:
                    engine.update_top(source, r0, r1)
                engine.synchronize()  # the step ends on the device too
                clock.mark("top")

        def factor_top(i):
            if failed[0] < 0:  # after a failure the blocks still move, so no rank waits
                clock.mark("exchange")
                failed[0] = engine.factor_top(i)
                updates.factored(i)
                clock.mark("top")

        if self.ipc:  # a block's place in the sender's memory moves; the owner's GPU reads it
            self._gather_up(engine.update_range, lambda i0, i1: np.empty(2, dtype=np.int64),
                            engine.add_peer_update, self.tops(), factor_top, apply_updates)
        else:
            self._gather_up(engine.update_block, engine.empty_update_block,
                            lambda i0, i1, block, source: engine.add_update(i0, i1, block),
                            self.tops(), factor_top, apply_updates)
        clock.mark("exchange")
        self.numeric_split.append([clock.seconds.get(step, 0.0) for step in NUMERIC_STEPS])
        first = min_over_ranks(comm, failed[0] if failed[0] >= 0 else self.plan.n)
        if first < self.plan.n:
            root_call(comm, self._not_positive_definite, first)
        if self.ipc:
            self._take_factored_pieces()
        shares = comm.gather(engine.logdet(), root=0)
        return float(sum(shares)) if shares is not None else float("nan")

    def _not_positive_definite(self, column):
        raise NotPositiveDefinite(self.perm[column], column)

    def solve(self, rhs):
        """Forward up the tree, backward down it, for ``rhs`` (this rank's rows)."""
        engine, comm, rank = self.engine, self.comm, self.rank
        engine.start_solve(rhs)
        engine.forward_local()
        tops = self._solve_tops()
        self._gather_up(engine.solve_block, engine.empty_solve_block,
                        lambda i0, i1, block, source: engine.add_solve_block(i0, i1, block),
                        tops, engine.forward_top)
        requests = []
        for i0, i1, owner, holders in reversed(tops):
            if owner == rank:
                for i in range(i1, i0 - 1, -1):
                    engine.backward_top(i)
                solved = engine.solved_block(i0, i1)
                for dest in holders:
                    if dest != rank:
                        requests += isend_array(comm, solved, int(dest), EXCHANGE_TAG)
            else:
                block = recv_array_into(comm, engine.empty_solve_block(i0, i1), owner, EXCHANGE_TAG)
                engine.set_solved_block(i0, i1, block)
        engine.backward_local()
        wait_requests(requests)
        self.solve_split.append(engine.take_local_solve_seconds())

    def gather_solution(self, x_local):
        """The solution's rows from every rank, assembled on rank 0 in the original numbering
        (float64; ``None`` elsewhere)."""
        parts = gather_arrays(self.comm, {"x": np.ascontiguousarray(x_local)})
        if parts is None:
            return None
        x = np.zeros((self.plan.n, self.nrhs), dtype=np.float64)
        for columns, part in zip(self.rank_columns, parts):
            x[self.perm[columns]] = part["x"]
        return x

    def close(self):
        """Before the engine is freed: with CUDA IPC every rank unmaps its peers' panels, and no
        rank goes on to free its own before every mapping of them is gone. *Collective.*"""
        if self.ipc:  # every mapping of a rank's panels is gone before any rank frees them
            self.engine.close_peers()
            self.comm.Barrier()
        self.engine = None
