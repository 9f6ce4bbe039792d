"""Every operation on the CPU backend at 8 ranks (more ranks than this machine has cores: the
8-rank code paths -- partitions of 8 parts, exchanges among 8, tensor grids of 8 -- run in CI
even where no 8-GPU machine is lent), verified against the reference and compared with the
same run at one rank."""
import numpy as np
import pytest

from helpers import run_config, write_config

RANKS = 8

#: operation, its params and input: small enough that 8 oversubscribed ranks finish in seconds
CASES = {
    "spmv_nnz_balanced": ("spmv", {"x": "random", "format": "csr5"},
                          {"generate": {"kind": "rmat", "scale": 9, "edge_factor": 8}},
                          {"strategy": "nnz_balanced"}),
    "spmv_row_modulo": ("spmv", {"x": "random"},
                        {"generate": {"kind": "poisson", "dims": [24, 23], "stencil": 5}},
                        {"strategy": "row_modulo"}),
    "spgemm": ("spgemm", {}, {"generate": {"kind": "rmat", "scale": 8, "edge_factor": 4}}, {}),
    "sptv": ("sptv", {}, {"generate": {"kind": "random_tensor", "dims": [30, 20, 40],
                                       "nnz": 3000}}, {}),
    "cpals": ("cpals", {"rank": 4, "max_iters": 5},
              {"generate": {"kind": "random_tensor", "dims": [30, 20, 40], "nnz": 3000}}, {}),
    "cholesky": ("cholesky", {},
                 {"generate": {"kind": "poisson", "dims": [20, 19], "stencil": 5}}, {}),
}

#: arrays of /result compared between 8 ranks and one (sums in another order: to round-off)
COMPARED = {"spmv": "y", "cholesky": "x"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_operation_at_eight_ranks_is_verified(tmp_path, case):
    operation, params, source, partition = CASES[case]
    sections = {"input": source, "backend": "cpu", "verify": {"enabled": True}}
    if partition:
        sections["partition"] = partition
    runs = {}
    for nprocs in (RANKS, 1):
        out = f"out{nprocs}"
        config = write_config(tmp_path, operation, params, name=f"run{nprocs}.yaml", out=out,
                              run={"repeats": 1, "warmup": 0}, **sections)
        runs[nprocs] = run_config(tmp_path, config, nprocs=nprocs, out=out)
        run = runs[nprocs][0]
        assert run["attrs"]["nranks"] == nprocs
        assert run["attrs"]["verify_passed"], f"{case} at {nprocs} ranks failed verification"
    name = COMPARED.get(operation)
    if name and name in runs[1][1] and name in runs[RANKS][1]:
        one, eight = runs[1][1][name], runs[RANKS][1][name]
        np.testing.assert_allclose(eight, one, rtol=1e-10, atol=1e-12 * np.abs(one).max())
