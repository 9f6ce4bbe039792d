"""The kernel cache (``hisparse.gpu._compile``): a cubin is compiled once per source,
options, architecture and compiler, and compiled again when any of them changes. nvcc itself is
replaced by a counting stand-in, so this runs without CUDA."""
import os
import stat

import pytest

from hisparse.gpu import _compile


def _fake_nvcc(directory, body="echo 13.0"):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "nvcc"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def compiles(monkeypatch, tmp_path):
    """Counts the compilations; each returns a cubin naming the compiler on PATH."""
    calls = []

    def compile_cubin(source, options, arch, name):
        calls.append((name, tuple(options), arch))
        return f"cubin {name} {arch} {_compile.nvcc_identity()}".encode()

    monkeypatch.setattr(_compile, "_compile_cubin", compile_cubin)
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "k.cu").write_text("__global__ void k() {}\n")
    (kernels / "common.cuh").write_text("// v1\n")
    monkeypatch.setenv("HISPARSE_KERNELS_DIR", str(kernels))
    monkeypatch.setenv("PATH", str(_fake_nvcc(tmp_path / "cuda-a").parent))
    _compile.nvcc_identity.cache_clear()
    yield calls, kernels, tmp_path
    _compile.nvcc_identity.cache_clear()


def test_cache_hits_until_source_header_options_or_compiler_change(compiles, monkeypatch):
    calls, kernels, root = compiles
    cache = str(root / "cache")

    def build(defines=None):
        return _compile._cubin("k", defines or {"VALUE_T": "double"}, "sm_90", cache, ())

    first, hit = build()
    assert not hit and len(calls) == 1
    again, hit = build()
    assert hit and again == first and len(calls) == 1
    build({"VALUE_T": "float"})  # other options
    assert len(calls) == 2
    (kernels / "common.cuh").write_text("// v2\n")  # a shared header changed
    build()
    assert len(calls) == 3
    # another toolkit first on PATH: its nvcc is another file
    monkeypatch.setenv("PATH", str(_fake_nvcc(root / "cuda-b", "echo 13.1").parent))
    _compile.nvcc_identity.cache_clear()
    other, hit = build()
    assert not hit and len(calls) == 4 and other != first
    # the same nvcc rewritten in place (an upgrade): its size changes
    _fake_nvcc(root / "cuda-b", "echo 13.1 update 1")
    _compile.nvcc_identity.cache_clear()
    _, hit = build()
    assert not hit and len(calls) == 5
    assert not [f for f in os.listdir(cache) if f.endswith(".tmp")]


def test_nvcc_identity_is_empty_without_nvcc(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    _compile.nvcc_identity.cache_clear()
    try:
        assert _compile.nvcc_identity() == ""
    finally:
        _compile.nvcc_identity.cache_clear()


def test_processes_needing_one_entry_compile_it_once(compiles, monkeypatch):
    """Four processes of a node asking for the same entry at once: one compiles (a slow
    stand-in for nvcc, counted in a file), the others wait on the entry's lock and read the
    cache; every one gets the same cubin. Nothing collective: a process that needs no kernel
    does not have to take part (the barrier this replaced deadlocked such ranks)."""
    import multiprocessing
    import time
    _, _, root = compiles
    cache, counter = str(root / "cache"), root / "compiles"

    def slow_compile(source, options, arch, name):
        with open(counter, "a") as handle:
            handle.write("x")
        time.sleep(0.3)
        return b"cubin " + name.encode()

    monkeypatch.setattr(_compile, "_compile_cubin", slow_compile)
    context = multiprocessing.get_context("fork")
    results = context.Queue()

    def build():
        cubin, hit = _compile._cubin("k", {"VALUE_T": "double"}, "sm_90", cache, ())
        results.put((cubin, hit))

    workers = [context.Process(target=build) for _ in range(4)]
    for worker in workers:
        worker.start()
    got = [results.get(timeout=30) for _ in workers]
    for worker in workers:
        worker.join(timeout=30)
        assert worker.exitcode == 0
    assert counter.read_text() == "x"
    assert {cubin for cubin, _ in got} == {b"cubin k"}
    assert sorted(hit for _, hit in got) == [False, True, True, True]


def test_default_cache_outlives_the_job_and_falls_back_to_tmpdir(monkeypatch, tmp_path):
    """The default cache is in the user's cache home (a per-job $TMPDIR is emptied after each
    job); $HISPARSE_CACHE_DIR overrides it; an unwritable home falls back to $TMPDIR."""
    monkeypatch.delenv("HISPARSE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "job-tmp"))
    home = _compile.default_cache_dir()
    assert home == str(tmp_path / "xdg" / "hisparse" / "kernels") and os.path.isdir(home)
    monkeypatch.setenv("HISPARSE_CACHE_DIR", str(tmp_path / "mine"))
    assert _compile.default_cache_dir() == str(tmp_path / "mine")
    monkeypatch.delenv("HISPARSE_CACHE_DIR")
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache home's parent should be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    assert _compile.default_cache_dir() == os.path.join(str(tmp_path / "job-tmp"),
                                                        f"hisparse-cache-{os.getuid()}")
