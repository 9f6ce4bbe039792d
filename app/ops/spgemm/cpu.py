"""CPU engine of SpGEMM: SciPy on this rank's rows of A, in row chunks when ``chunk_rows`` is
set. No MPI: it takes the local rows and B and keeps the local rows of C, which the operation
collects after the timed repeats (whole, or as checksums and sampled rows)."""
import numpy as np

from .. import Engine
from .checksums import host_checksums, take_rows


class CpuSpgemmEngine(Engine):
    """SciPy ``A_local @ B`` on the host.

    Parameters
    ----------
    ctx : EngineContext
    local : SpgemmLocal
        ``a`` (local rows of A), ``b`` (all of B), ``b_is_a``, ``products``.
    params : dict
        ``operation.params`` (``chunk_rows``).
    """

    def __init__(self, ctx, local, params):
        super().__init__(ctx, local, params)
        self.stats = {}
        self.c_host = None

    def upload(self):
        self.a = self.local.a.to_scipy()
        self.b = self.a if self.local.b_is_a else self.local.b.to_scipy()

    def multiply(self):
        """Compute this rank's rows of C (kept: :meth:`local_result`), sorted columns."""
        local = self.local.a
        n = self.a.shape[0]
        step = self.params["chunk_rows"] or max(n, 1)
        self.c_host = None  # the previous repeat's C goes before this one is built
        pieces = []
        with self.ctx.timer.phase("numeric"):
            for start in range(0, n, step):
                block = (self.a[start:start + step] @ self.b).tocsr()
                block.sort_indices()
                pieces.append(block)
        indptr = np.zeros(n + 1, np.int64)
        offset = 0
        for start, piece in zip(range(0, n, step), pieces):
            indptr[start + 1:start + 1 + piece.shape[0]] = offset + piece.indptr[1:]
            offset += piece.nnz
        indices = np.concatenate([p.indices for p in pieces]) if pieces else np.zeros(0, np.int32)
        data = np.concatenate([p.data for p in pieces]) if pieces else \
            np.zeros(0, local.data.dtype)
        self.stats = {"n_chunks": len(pieces) or 1, "chunked_for_memory": False,
                      "nnz_c": int(offset)}
        self.c_host = (indptr, indices.astype(local.indices.dtype, copy=False),
                       data.astype(local.data.dtype, copy=False))

    # -- after the repeats ----------------------------------------------------------------------
    def local_result(self):
        """This rank's rows of C: ``(indptr int64, indices, data)``."""
        return self.c_host

    def checksums(self):
        """``(row_nnz int64, row_sums, row_weighted_sums)`` of the local C (float64 sums; see
        :mod:`.checksums`)."""
        return host_checksums(*self.c_host)

    def sample(self, positions):
        """Local rows ``positions`` of C: ``(indptr int64, indices, data)``."""
        return take_rows(*self.c_host, positions)

    def free_result(self):
        self.c_host = None

    def free(self):
        self.free_result()
        super().free()


ENGINES = {None: CpuSpgemmEngine}
