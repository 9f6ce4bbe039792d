"""SpMV, y = A x, over row partitions of A, in CSR (CSR-vector kernel) or CSR5 format.

Plan: rank 0 partitions A's rows (nnz-balanced blocks by default, or row-modulo), scatters the row
blocks and broadcasts x. Each rank keeps its block resident on its GPU (uploaded once; for CSR5
converted on the GPU once, phase ``convert``), then every repetition copies x in, runs
``iterations`` products, copies its part of y out, and y is gathered to rank 0 in global row
order. The engines (``cpu.py``, ``gpu.py``) see only this rank's block; the collectives (the
global mean row length, the slowest conversion, the gather of y) are planned here. Design notes:
docs/ops/spmv.md.
"""
from dataclasses import dataclass

import numpy as np

from ...config import Setting, positive
from ...errors import HisparseError
from ...formats import CSRMatrix
from ...formats._csr5 import MAX_SIGMA, default_sigma
from ...parallel import AllReduce, RowGather, max_over_ranks
from ...partition import partition_rows
from .._base import Operation
from .._vectors import make_vector, vector_spec_check
from .peers import PEERS


def _sigma_check(value):
    return None if 1 <= value <= MAX_SIGMA else f"must lie in [1, {MAX_SIGMA}]"


def threads_per_row(mean_row_length):
    """Lanes per row for the CSR-vector kernel: the power of two nearest the mean row length."""
    if mean_row_length <= 1:
        return 1
    return int(min(32, 2 ** round(np.log2(mean_row_length))))


@dataclass
class SpmvLocal:
    """What an SpMV engine works on: this rank's rows of A and the whole x.

    Attributes
    ----------
    matrix : CSRMatrix
        This rank's row block, shape ``(local rows, n)``.
    x : ndarray, shape (n,)
    sigma : int or None
        CSR5 tile height, the same on every rank (so every rank compiles the same kernel);
        ``None`` for format ``csr``.
    """

    matrix: CSRMatrix
    x: np.ndarray
    sigma: int = None


class SpMV(Operation):
    """y = A x for a sparse matrix A (CSR), partitioned by rows."""

    NAME = "spmv"
    INPUT_KIND = "matrix"
    PARAMS = {
        "format": Setting(str, "csr", "Sparse format of the kernel.", choices=("csr", "csr5")),
        "iterations": Setting(int, 1, "Products per repetition on resident data.", check=positive),
        "x": Setting(str, "random", "'random', 'ones' or 'FILE.h5:/dataset'.",
                     check=vector_spec_check),
        "threads_per_row": Setting(int, None, "CSR-vector lanes per row; null = from the mean "
                                              "row length.", nullable=True,
                                   choices=(1, 2, 4, 8, 16, 32)),
        "sigma": Setting(int, None, "CSR5 tile height (entries per lane, 1..32); null = the mean "
                                    "row length clamped to [16, 32].", nullable=True,
                         check=_sigma_check),
    }
    PARTITIONS = ("nnz_balanced", "row_modulo", "row_blocks")
    PEERS = tuple(PEERS)
    SETUP_PHASES = {"partition": "setup", "distribute": "communication", "upload": "transfer",
                    "convert": "setup"}
    REPEAT_PHASES = {"h2d": "transfer", "kernel": "compute", "d2h": "transfer",
                     "gather": "communication"}
    COMPUTE_PHASES = ("kernel",)

    def setup(self, problem):
        ctx = self.ctx
        part, shared = self.distribute(problem)
        matrix = CSRMatrix(part["indptr"], part["indices"], part["data"],
                           (len(part["indptr"]) - 1, part["ncols"]))
        # CSR5's sigma follows the global mean row length, so every rank compiles the same kernel.
        totals = AllReduce(ctx.comm)(np.array([matrix.nnz, matrix.nrows], np.int64))
        self.mean_row_length = float(totals[0]) / max(int(totals[1]), 1)
        sigma = None
        if self.params["format"] == "csr5":
            sigma = self.params["sigma"] or default_sigma(self.mean_row_length)
        self.local = SpmvLocal(matrix, shared["x"], sigma)
        self.gather_y = RowGather(ctx.comm, part["rows"], part["nrows"])
        self.y_full = None
        self.engine = self.pick_engine(self.local, self.params["format"])
        with ctx.timer.phase("upload"):
            self.engine.upload()
        self.convert_seconds = 0.0
        if hasattr(self.engine, "convert"):
            self.convert_seconds = self.engine.convert()
        # The slowest rank's conversion is what a run waits for.
        self.convert_seconds_max = max_over_ranks(ctx.comm, self.convert_seconds)

    def partition(self, problem):
        ctx = self.ctx
        x = make_vector(self.params["x"], problem.ncols, problem.data.dtype,
                        ctx.config["run.seed"])
        plan = partition_rows(problem.indptr, ctx.size, self.strategy)
        parts = []
        for rows in plan.rows:
            block = (problem.row_block(int(rows[0]), int(rows[-1]) + 1) if plan.contiguous
                     else problem.rows(rows))
            parts.append({"indptr": block.indptr.astype(problem.indptr.dtype),
                          "indices": block.indices, "data": block.data, "rows": rows,
                          "ncols": problem.ncols, "nrows": problem.nrows})
        self.x_global = x
        return parts, {"x": x}

    def run_once(self):
        y_local = self.engine.multiply(self.params["iterations"])
        with self.ctx.timer.phase("gather"):
            self.y_full = self.gather_y(y_local)

    def teardown(self):
        self.engine.free()

    def result(self):
        return self.y_full

    def result_arrays(self, result):
        return {"y": result}

    def reference(self, problem):
        return problem.to_scipy().astype(np.float64) @ self.x_global.astype(np.float64)

    def work(self, problem):
        value = problem.data.dtype.itemsize
        index = problem.indices.dtype.itemsize
        m, n, nnz = problem.nrows, problem.ncols, problem.nnz
        per_product = nnz * (value + index) + (m + 1) * index + m * value + n * value
        k = self.params["iterations"]
        return {"flops": 2.0 * nnz * k, "bytes": float(per_product) * k}

    def run_peer(self, name, problem, repeats):
        if name not in PEERS:
            raise HisparseError(f"unknown peer {name}")
        return PEERS[name](problem, self.x_global, repeats, self.params["iterations"])

    def summary(self):
        """CSR5: sigma, tiles and the conversion cost in SpMV-equivalents (conversion time of the
        slowest rank over rank 0's median time of one product)."""
        if self.params["format"] != "csr5":
            return {}
        config = self.ctx.config
        wall, gpu = self.ctx.timer.arrays(config["run.repeats"])
        column = list(self.phases()).index("kernel")
        seconds = np.where(np.isnan(gpu[:, column]), wall[:, column], gpu[:, column])
        per_product = float(np.nanmedian(seconds)) / self.params["iterations"]
        return {"csr5_sigma": int(self.engine.sigma), "csr5_tiles_rank0": int(self.engine.tiles),
                "csr5_convert_seconds": float(self.convert_seconds_max),
                "csr5_spmv_seconds": per_product,
                "csr5_convert_spmv_equivalents": float(self.convert_seconds_max / per_product)
                if per_product > 0 else float("nan")}

    def rank_info(self):
        matrix, x = self.local.matrix, self.local.x
        info = {"n_rows": int(matrix.nrows), "nnz": int(matrix.nnz),
                "bytes_h2d": int(x.nbytes), "bytes_d2h": int(matrix.nrows * x.itemsize)}
        if self.params["format"] == "csr5":
            info.update(csr5_sigma=int(self.engine.sigma), csr5_tiles=int(self.engine.tiles),
                        csr5_convert_seconds=float(self.convert_seconds))
            steps = getattr(getattr(self.engine, "device", None), "convert_steps", {})
            info.update({f"csr5_convert_{k}_seconds": float(v) for k, v in steps.items()})
        return info
