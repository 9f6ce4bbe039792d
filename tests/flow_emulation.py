"""The GPU Cholesky engine's dataflow solves (``solve_forward_flow``, ``solve_backward_flow``)
emulated on the host, task by task in ticket order, for the tests of the one-rank engine
(``tests/test_cholesky.py``) and of a rank's subtrees under strategy subtree
(``tests/test_cholesky_subtree.py``)."""
import numpy as np

from hisparse.ops.cholesky import schedule


def chunk_geometry(sym, plan, v):
    """Chunk ``v`` of ``plan``: its supernode, first column in it, width, the panel's leading
    dimension, the place of its diagonal block in the value array, and its below rows' count."""
    s, c0, w = int(plan.sup[v]), int(plan.c0[v]), int(plan.width[v])
    ld = int(sym.nrows[s])
    return s, c0, w, ld, int(sym.panel_offset[s]) + c0 * ld + c0, ld - c0 - w


class FlowSolveOnHost:
    """The tasks of ``flow`` (:class:`~hisparse.ops.cholesky.schedule.FlowTasks` of the solve chunk
    plan ``plan``) over the factor values ``lx``, run in ticket order, checking at the start of
    every unit that what its kernel waits for is already there -- so no unit ever waits on one
    with a later ticket or on one of its own task (no deadlock whatever the scheduling) -- and
    that every unit's target list is the set of chunks of its below rows. Right-hand sides and
    solutions are (n, k) arrays (views work: they are updated in place)."""

    def __init__(self, sym, plan, flow, lx):
        self.sym, self.plan, self.flow, self.lx = sym, plan, flow, lx
        self.nchunks = len(plan.sup)
        self.chunk_of_column = np.repeat(np.arange(self.nchunks), plan.width)

    def _unit(self, u):
        sym, plan, flow, lx = self.sym, self.plan, self.flow, self.lx
        v, part = int(flow.unit_chunk[u]), int(flow.unit_part[u])
        s, c0, w, ld, diag, m = chunk_geometry(sym, plan, v)
        if part < 0:  # a small unit: one warp, all its rows
            assert w <= schedule.SMALL_UNIT and m <= schedule.SMALL_UNIT
            part = 0
        d = np.tril(lx[diag + np.arange(w)[:, None] + np.arange(w)[None, :] * ld])
        rows = sym.rows[sym.rows_offset[s] + c0 + w:sym.rows_offset[s + 1]]
        below = lx[diag + w + np.arange(m)[:, None] + np.arange(w)[None, :] * ld]
        mine = slice(part * schedule.CHUNK_THREADS, (part + 1) * schedule.CHUNK_THREADS)
        targets = flow.target_chunk[flow.target_ptr[u]:flow.target_ptr[u + 1]]
        np.testing.assert_array_equal(np.sort(targets),
                                      np.unique(self.chunk_of_column[rows[mine]]))
        first = int(sym.starts[s]) + c0
        return (v, part, first, w, d, rows[mine], below[mine], targets,
                max(1, -(-m // schedule.CHUNK_THREADS)))

    def _units_of(self, t):
        flow = self.flow
        units = list(range(flow.task_unit[t], flow.task_unit[t + 1]))
        assert len(units) == 1 or (all(flow.unit_part[units] < 0)
                                   and len(units) <= schedule.CHUNK_THREADS // 32)
        return [self._unit(u) for u in units]

    def forward(self, work, y):
        """L y = work over the listed chunks: ``work`` accumulates the sums (also at chunks
        not listed), part 0 of every listed chunk writes its columns of ``y``. Returns the
        ``arrived`` counts, which equal ``expected``."""
        flow = self.flow
        arrived = np.zeros(self.nchunks, int)
        for t in range(flow.ntasks):
            units = self._units_of(t)
            for v, *_ in units:  # the units of a task wait at once: none may feed another
                assert arrived[v] == flow.expected[v]  # every producer came first
            for v, part, first, w, d, rows, below, targets, _ in units:
                solution = np.linalg.solve(d, work[first:first + w])
                if part == 0:
                    y[first:first + w] = solution
                work[rows] -= below @ solution
                arrived[targets] += 1
        np.testing.assert_array_equal(arrived, flow.expected)
        return arrived

    def backward(self, y, solved):
        """L^T x = y in place over the listed chunks, tasks in reverse ticket order; ``solved``
        (one flag per chunk) says which chunks are solved already (those not listed, whose
        rows the listed units read); every chunk is solved at the end."""
        flow = self.flow
        contributed = np.zeros(self.nchunks, int)
        for ticket in range(flow.ntasks):
            units = self._units_of(flow.ntasks - 1 - ticket)
            for _, _, _, _, _, _, _, targets, _ in units:
                assert solved[targets].all()  # the chunks of its below rows are solved
            for v, part, first, w, d, rows, below, targets, parts in units:
                y[first:first + w] -= below.T @ y[rows]
                if part:
                    contributed[v] += 1
                else:  # part 0 comes last and solves
                    assert contributed[v] == parts - 1
                    y[first:first + w] = np.linalg.solve(d.T, y[first:first + w])
                    solved[v] = True
        assert solved.all()
