"""Every CUDA source compiles for Hopper with nvcc (no GPU needed), with its default macros and
with the fp32 / int64 variants the runtime uses."""
import shutil
import subprocess
from pathlib import Path

import pytest

KERNELS = sorted((Path(__file__).resolve().parents[1] / "kernels_cu").glob("*.cu"))
NVCC = shutil.which("nvcc")
VARIANTS = {
    "default": [],
    "fp32-int64": ["-DVALUE_T=float", "-DINDEX_T=long long"],
    # spmv_csr5.cu's product without a values array (a matrix of one value); the other sources
    # ignore the macro
    "uniform-values": ["-DUNIFORM_VALUES=1"],
}


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("source", KERNELS, ids=[k.name for k in KERNELS])
def test_cu_file_compiles_for_sm90(tmp_path, source, variant):
    command = [NVCC, "-cubin", "-arch=sm_90", "-O3", "-std=c++17", *VARIANTS[variant],
               "-I", str(source.parent), "-o", str(tmp_path / "out.cubin"), str(source)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out.cubin").stat().st_size > 0


def test_there_are_kernels_to_compile():
    assert KERNELS, "kernels_cu/ holds no .cu files"
