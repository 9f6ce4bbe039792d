"""Iterative refinement of a Cholesky solution (:func:`refine`): the residual in fp64, a
correction solved with the resident factor, x += d. An engine of one rank refines its own
solution; under strategy ``subtree`` :class:`RankRefinement` refines the rows left on every rank,
the correction solved along the elimination tree."""


def refine(engine, steps, tolerance):
    """Iterative refinement of the engine's solution, in place: the residual r = b - A x
    (fp64, A's values as loaded), a solve A d = r with the resident factor, x += d.

    Parameters
    ----------
    engine : CpuFactorEngine, GpuFactorEngine or RankRefinement
        After ``solve()``: its ``residual()``, ``backward_error()`` and ``correct()``.
    steps : {"auto", 0, 1, 2}
        ``auto``: one step when the measured componentwise backward error of the solution
        exceeds ``tolerance``, none otherwise (the common case then pays one residual and an
        8-byte read, not a second solve); an integer: that many steps.
    tolerance : float

    Returns
    -------
    (int, float)
        The steps made, and the backward error of the unrefined solution (NaN when
        ``steps`` is 0: not measured).
    """
    if steps == 0:
        return 0, float("nan")
    engine.residual()
    error = engine.backward_error()
    if steps == "auto":
        steps = 1 if error > tolerance else 0
    for step in range(steps):
        if step:
            engine.residual()
        engine.correct()
    return steps, error


class RankRefinement:
    """This rank's rows ``x`` of the subtree strategy's solution, refined as :func:`refine`
    refines an engine's: :meth:`residual` measures every rank's rows of the residual
    (``measure``: a :class:`~.residual.RankResidual`; the backward error is the largest of any
    rank's) and :meth:`correct` adds ``solve(r)``, this rank's rows of the correction solved
    from them along the tree. Both collective."""

    def __init__(self, x, measure, solve):
        self.x, self.measure, self.solve = x, measure, solve
        self.r, self.error = None, float("nan")

    def residual(self):
        self.r, self.error = self.measure(self.x)

    def backward_error(self):
        return self.error

    def correct(self):
        self.x += self.solve(self.r)
