"""The first run on a fresh install says when it compiles (CUDA kernels with nvcc, host code with
Numba) instead of spending seconds in silence; a run that loads from the caches says nothing."""
import os
import subprocess
import sys

import pytest

from hisparse.compiled import HAVE_NUMBA
from hisparse.gpu import _compile

from conftest import ROOT


def test_a_kernel_compiled_rather_than_loaded_is_announced_once(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_nvcc(source, options, arch, name):
        calls.append(name)
        return b"cubin of " + name.encode()

    monkeypatch.setattr(_compile, "_compile_cubin", fake_nvcc)
    cubin, hit = _compile._cubin("spmv_csr", {"VALUE_T": "double"}, "sm_90", str(tmp_path), ())
    assert (cubin, hit, calls) == (b"cubin of spmv_csr", False, ["spmv_csr"])
    err = capsys.readouterr().err
    assert err == (f"hisparse: compiling kernels_cu/spmv_csr.cu for sm_90 (first run only; "
                   f"cached in {tmp_path})...\n")
    cubin, hit = _compile._cubin("spmv_csr", {"VALUE_T": "double"}, "sm_90", str(tmp_path), ())
    assert (cubin, hit, calls) == (b"cubin of spmv_csr", True, ["spmv_csr"])
    assert capsys.readouterr().err == ""  # loaded from the cache: silent


_FIRST_CALL = ("import numpy as np; from hisparse.compiled import fingerprint; "
               "print(fingerprint(np.arange(1000)))")


@pytest.mark.skipif(not HAVE_NUMBA, reason="Numba is not installed")
def test_numba_compiling_on_a_fresh_cache_is_announced(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    runs = [subprocess.run([sys.executable, "-c", _FIRST_CALL], capture_output=True, text=True,
                           cwd=ROOT, env=env, timeout=300) for _ in range(2)]
    for proc in runs:
        assert proc.returncode == 0, proc.stderr
    assert runs[0].stdout == runs[1].stdout  # the same fingerprint, compiled or loaded
    notice = "hisparse: compiling host code with Numba (first run only; cached in"
    assert runs[0].stderr.count(notice) == 1 and str(tmp_path / "numba") in runs[0].stderr
    assert notice not in runs[1].stderr, runs[1].stderr
