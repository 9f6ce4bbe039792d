"""SpMV engines on the host: SciPy for CSR, the NumPy builder and the compiled product for CSR5
(the same bits as the format's NumPy reference product). The CPU backend, and the reference the
GPU engines are compared with.

Both backends' engines offer the same steps, which :meth:`SpMV.run_once` composes with the halo
exchange and the all-reduce of the chain: ``start`` (x back to its initial value),
``begin_exchange`` / ``pack`` / ``end_exchange`` (around the exchange of ghost entries; the host
runs in order, so only ``pack`` does something here), ``multiply_local`` (y = A_local x; nothing
when the blocks are merged), ``add_ghost`` (y += A_ghost x_ghost; merged: y = A x_all), under the
checkerboard ``fold_values`` / ``fold_buffer`` / ``add_fold`` (the partial sums of foreign rows
sent, those received for the owned rows added) and, in a chain, ``next_x`` (x = y / sqrt(norm2)
with the previous x's all-reduced ``norm2``, then ``norm2`` = this rank's sum of the new x^2, which
the operation all-reduces with the next product's exchange); ``result`` is this rank's last y.
``stream`` / ``comm_stream`` are None: phases are timed by the host clock.
"""
import time

import numpy as np

from ...formats import build_csr5, csr5_spmv_compiled
from .. import Engine


class _HostEngine(Engine):
    """The distributed product's steps on the host; subclasses define :meth:`product` (the
    local block times x)."""

    stream = comm_stream = None

    def upload(self):
        """Host copies of x (owned and received entries in one buffer, as ``SpmvLocal`` lays
        them out) and y, and the blocks in SciPy form."""
        local = self.local
        dtype = local.matrix.data.dtype
        self.ghost = local.ghost.to_scipy()
        self.x_all = np.zeros(local.x_length, dtype)
        self.x = self.x_all[local.x_offset:local.x_offset + len(local.x)]
        self.x[:] = local.x
        self.x_ghost = self.x_all[local.ghost_offset:]
        self.y = np.zeros(local.matrix.nrows, dtype)
        self.norm2 = np.zeros(1, dtype)
        self.matrix = local.matrix.to_scipy()
        self.ghost_csr5 = None
        self.fold = None if local.fold is None else local.fold.to_scipy()
        self.fold_buffer = np.zeros(0 if local.fold is None else local.fold.ncols, dtype)

    def convert(self):
        """Build the CSR5 forms (NumPy builder): the local block's (:class:`Csr5Engine`) and
        the ghost block's (``ghost_sigma``); returns the seconds it took."""
        with self.ctx.timer.phase("convert"):
            start = time.perf_counter()
            self._convert_local()
            if self.local.ghost_sigma and self.local.ghost.nnz:
                self.ghost_csr5 = build_csr5(self.local.ghost, self.local.ghost_sigma)
            seconds = time.perf_counter() - start
        return seconds

    def _convert_local(self):
        """Convert the local block (SciPy's CSR: nothing to do)."""

    def start(self):
        self.x[:] = self.local.x

    def begin_exchange(self):
        """Nothing to order on the host."""

    def pack(self):
        """The entries of x the peers need, in the exchange's send order."""
        return self.x[self.local.send_index]

    def end_exchange(self):
        """Nothing to order on the host."""

    def multiply_local(self):
        """y = A_local x (nothing when the blocks are merged: all comes after the exchange)."""
        if not self.local.merged:
            self.y = self.product(self.x)

    def add_ghost(self):
        """y[ghost rows] += A_ghost x_ghost, or y = A x_all when the blocks are merged."""
        if self.local.merged:
            self.y = self.product(self.x_all)
        elif self.ghost_csr5 is not None:
            self.y[self.local.ghost_rows] += csr5_spmv_compiled(self.ghost_csr5, self.x_ghost)
        elif self.local.ghost.nrows:
            self.y[self.local.ghost_rows] += self.ghost @ self.x_ghost

    def fold_values(self):
        """The partial sums of the foreign rows, in their order (what the fold sends)."""
        return self.y[self.local.n_rows:]

    def add_fold(self):
        """y[fold rows] += the partial sums received for them (``fold_buffer``)."""
        if self.fold is not None and self.fold.shape[0]:
            self.y[self.local.fold_rows] += self.fold @ self.fold_buffer

    def next_x(self, scaled):
        """x = y / sqrt(norm2) with the previous x's all-reduced ``norm2`` (0 when it is 0;
        x = y when not ``scaled``), then ``norm2`` = this rank's sum of the new x^2."""
        scale = 1.0
        if scaled:
            norm2 = self.norm2[0]
            scale = 1 / np.sqrt(norm2) if norm2 > 0 else 0.0
        self.x[:] = self.y[:self.local.n_rows] * self.y.dtype.type(scale)
        # NumPy's pairwise sum, not np.dot: BLAS's threads woke for every product (32k entries:
        # 30 ms a call on a host whose cores other processes share)
        self.norm2[0] = np.add.reduce(np.square(self.x))

    def result(self):
        """A chain's last y (:meth:`next_x` left it in x), or y."""
        return (self.x if self.local.chained else self.y[:self.local.n_rows]).copy()

    def product(self, x):
        """The local (or merged) block times ``x``."""
        raise NotImplementedError

    def free(self):
        self.matrix = self.ghost = self.ghost_csr5 = self.fold = None
        super().free()


class CsrEngine(_HostEngine):
    """SciPy's CSR product."""

    def product(self, x):
        return self.matrix @ x


class Csr5Engine(_HostEngine):
    """CSR5 on the host: the NumPy builder (phase ``convert``) and the NumPy CSR5 product."""

    def __init__(self, ctx, local, params):
        super().__init__(ctx, local, params)
        self.sigma = local.sigma
        self.tiles = 0

    def _convert_local(self):
        self.matrix = build_csr5(self.local.matrix, self.sigma)
        self.tiles = self.matrix.num_tiles

    def product(self, x):
        return csr5_spmv_compiled(self.matrix, x)


ENGINES = {"csr": CsrEngine, "csr5": Csr5Engine}
