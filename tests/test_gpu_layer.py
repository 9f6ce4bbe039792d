"""The GPU plumbing layer, checked without a GPU: kernel tables derive every launch signature
from the ``extern "C" __global__`` declarations of ``kernels_cu/`` (so a signature cannot drift
from its kernel), the dtype map, grid sizing, and the shared CUDA header."""
import re
from pathlib import Path

import numpy as np
import pytest

from hisparse.gpu import _kernels
from hisparse.gpu._kernels import (KernelTable, c_type, grid_1d, kernel_declarations, signature,
                                   type_defines)

KERNELS_DIR = Path(__file__).resolve().parents[1] / "kernels_cu"
SOURCES = sorted(p.stem for p in KERNELS_DIR.glob("*.cu"))
VARIANTS = [{}, {"VALUE_T": "float", "INDEX_T": "long long"}]


def _declared_count(stem):
    text = (KERNELS_DIR / f"{stem}.cu").read_text()
    return len(re.findall(r'extern\s+"C"\s+__global__', text))


@pytest.mark.parametrize("stem", SOURCES)
def test_every_declared_kernel_is_parsed(stem):
    assert len(kernel_declarations(stem)) == _declared_count(stem)


@pytest.mark.parametrize("defines", VARIANTS, ids=["default", "fp32-int64"])
@pytest.mark.parametrize("stem", SOURCES)
def test_every_kernel_parameter_has_a_launch_code(stem, defines):
    for name, params in kernel_declarations(stem).items():
        sig = signature(stem, name, defines)
        assert len(sig) == len(params), name
        assert set(sig) <= set("PdfiIqQhHbB?"), (name, sig)


def test_index_and_value_macros_change_the_scalar_codes():
    # spmv_csr_vector(const INDEX_T n_rows, 6 pointers): the row count is packed by INDEX_T.
    assert signature("spmv_csr", "spmv_csr_vector", {"INDEX_T": "int"}) == "iPPPPPP"
    assert signature("spmv_csr", "spmv_csr_vector", {"INDEX_T": "long long"}) == "qPPPPPP"


def test_signatures_match_the_launches_validated_on_the_gpu():
    # Signatures that were typed by hand and checked on the H100 before the tables existed.
    expected = {
        ("spmv_csr5", "csr5_tile_ptr"): "qqPP",
        ("spmv_csr5", "csr5_spmv_tiles"): "qPPPPPPPPPP",
        ("spmv_csr5", "csr5_spmv_tail"): "qqqqqPPPPPP",
        ("spgemm_hash", "row_products"): "qqPPPqiPiPPP",
        ("spgemm_hash", "symbolic_shared"): "PiPPPPiiPPP",
        ("spgemm_hash", "numeric_global"): "PiPPPPPPPPPPPqPP",
        ("spgemm_hash", "scan_block_sums"): "Pq",
    }
    for (stem, name), sig in expected.items():
        assert signature(stem, name) == sig, name


def test_unknown_kernel_names_the_file():
    with pytest.raises(Exception, match="spmv_csr.cu"):
        KernelTable("spmv_csr", ["no_such_kernel"]).signatures()


def test_unmapped_parameter_type_is_an_error():
    with pytest.raises(Exception, match="PARAM_CODES"):
        _kernels.param_code("const struct thing t")


def test_type_map_and_defines():
    assert c_type(np.float64) == "double" and c_type(np.float32) == "float"
    assert c_type(np.int32) == "int" and c_type(np.int64) == "long long"
    assert type_defines(np.float32, np.int64, SIGMA=16) == {
        "VALUE_T": "float", "INDEX_T": "long long", "SIGMA": 16}


def test_grid_covers_every_thread():
    assert grid_1d(0, 256) == (1, 1)
    assert grid_1d(256, 256) == (1, 1)
    assert grid_1d(257, 256) == (2, 1)


def test_warp_helpers_live_only_in_the_shared_header():
    for source in KERNELS_DIR.glob("*.cu"):
        text = source.read_text()
        assert "#define FULL_MASK" not in text, source.name
        assert '#include "hisparse_common.cuh"' in text, source.name
        assert "0xffffffffu" not in text, f"{source.name}: use FULL_MASK from the header"
