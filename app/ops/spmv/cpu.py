"""SpMV engines on the host: SciPy for CSR, the NumPy builder and product for CSR5 (the
format's reference). The CPU backend, and the reference the GPU engines are compared with."""
import time

from ...formats._csr5 import build_csr5, csr5_spmv
from .._base import Engine


class _HostEngine(Engine):
    """``iterations`` host products in phase ``kernel``; subclasses define :meth:`product`."""

    def upload(self):
        """Nothing to place on a device (the operation times phase ``upload`` on every backend)."""

    def multiply(self, iterations):
        """``iterations`` products of the local block with x; returns y (local rows)."""
        with self.ctx.timer.phase("kernel"):
            for _ in range(iterations):
                y = self.product()
        return y

    def product(self):
        raise NotImplementedError

    def free(self):
        self.matrix = None
        super().free()


class CsrEngine(_HostEngine):
    """SciPy's CSR product."""

    def upload(self):
        self.matrix = self.local.matrix.to_scipy()

    def product(self):
        return self.matrix @ self.local.x


class Csr5Engine(_HostEngine):
    """CSR5 on the host: the NumPy builder (phase ``convert``) and the NumPy CSR5 product."""

    def __init__(self, ctx, local, params):
        super().__init__(ctx, local, params)
        self.sigma = local.sigma
        self.tiles = 0

    def convert(self):
        """Build the CSR5 form of the local block; returns the seconds it took."""
        with self.ctx.timer.phase("convert"):
            start = time.perf_counter()
            self.matrix = build_csr5(self.local.matrix, self.sigma)
            seconds = time.perf_counter() - start
        self.tiles = self.matrix.num_tiles
        return seconds

    def product(self):
        return csr5_spmv(self.matrix, self.local.x)


ENGINES = {"csr": CsrEngine, "csr5": Csr5Engine}
