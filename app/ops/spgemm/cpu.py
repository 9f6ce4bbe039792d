"""CPU engine of SpGEMM: SciPy on this rank's rows of A, in row chunks when ``chunk_rows`` is
set. No MPI: it takes the local rows and B and returns the local rows of C."""
import numpy as np

from .._base import Engine


def row_sums(indptr, data):
    """Sum of each row's values, float64, shape (len(indptr) - 1,)."""
    lengths = np.diff(np.asarray(indptr, dtype=np.int64))
    rows = np.repeat(np.arange(len(lengths)), lengths)
    return np.bincount(rows, weights=data.astype(np.float64), minlength=len(lengths))


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
        """This rank's rows of C: ``(indptr int64, indices, data)`` with sorted columns."""
        local = self.local.a
        n = self.a.shape[0]
        step = self.params["chunk_rows"] or max(n, 1)
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
        return self.c_host

    def digest(self):
        """``(row_nnz int64, row_sums float64)`` of the local C (``keep_distributed``)."""
        indptr, _, data = self.c_host
        return np.diff(indptr), row_sums(indptr, data)

    def free(self):
        self.c_host = None
        super().free()


ENGINES = {None: CpuSpgemmEngine}
