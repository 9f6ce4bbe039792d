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


def test_a_parameter_list_macro_expands_to_its_arrays():
    # The chunk kernels spell their 7 chunk/supernode tables once (CHUNK_TABLE_PARAMS) and the
    # flow solves their 6 task arrays (FLOW_TASK_PARAMS): the signature is the arrays' own.
    params = kernel_declarations("cholesky")["solve_forward_flow"]
    assert params[:3] == ["int ntasks", "const int* __restrict__ task_unit",
                          "const int* __restrict__ unit_chunk"]
    assert "const long long* __restrict__ rows_off" in params
    assert signature("cholesky", "solve_forward_flow") == "i" + "P" * 13 + "PPiiPPPi"
    assert signature("sptv", "sptv_fiber_groups") == "iP" + "P" * 6


def test_overridable_type_macros_are_not_expanded_by_their_defaults():
    # INDEX_T has a default (#ifndef INDEX_T / #define INDEX_T int) that a compilation's -D
    # replaces: the parameter keeps the name, so the -D value decides its code.
    assert "const INDEX_T n_rows" in kernel_declarations("spmv_csr")["spmv_csr_vector"]


def test_macro_expansion_is_bounded_and_whole_word():
    macros = {"PAIR": "int a, int b", "TWICE": "PAIR, PAIR", "LOOP": "LOOP x"}
    assert _kernels._expand_macros("TWICE, int c", macros) == "int a, int b, int a, int b, int c"
    assert _kernels._expand_macros("PAIRS", macros) == "PAIRS"
    assert _kernels._expand_macros("LOOP", macros).startswith("LOOP x x")


def test_index_and_value_macros_change_the_scalar_codes():
    # spmv_csr_vector(const INDEX_T n_rows, 6 pointers): the row count is packed by INDEX_T.
    assert signature("spmv_csr", "spmv_csr_vector", {"INDEX_T": "int"}) == "iPPPPPP"
    assert signature("spmv_csr", "spmv_csr_vector", {"INDEX_T": "long long"}) == "qPPPPPP"


def test_signatures_match_the_launches_validated_on_the_gpu():
    # Signatures that were typed by hand and checked on the H100 before the tables existed
    # (csr5_spmv: the tiles and tail kernels merged, issue 15; its row map for the ghost block,
    # issue 33; the wide tiles' empty rows, issue 33).
    expected = {
        ("spmv_csr5", "csr5_tile_ptr"): "qqPP",
        ("spmv_csr5", "csr5_spmv"): "qqqqqqqqPPPPPPPPPPPPP",
        ("spgemm_hash", "row_products"): "qqPPPqiPiPPP",
        ("spgemm_hash", "symbolic_shared"): "PiPPPPiiiiPPP",
        ("spgemm_hash", "numeric_global"): "PiPPPPPPPPPPPqPPi",
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


# -- CUDA graphs (app/gpu/_graphs.py) -------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("count,unit", [(1, 64), (2, 64), (64, 8), (150, 64)])
def test_replay_plan_runs_every_step_once_in_order(count, unit):
    """A first step and ``count - 1`` later steps, recorded as graphs of at most ``unit`` steps:
    one replay runs each step exactly once, in order (x <- 3 x + step's constant, in wrapping
    64-bit integers: exact and order sensitive), and recording runs nothing."""
    from pycuda.elementwise import ElementwiseKernel
    import pycuda.driver as cuda
    import pycuda.gpuarray as gpuarray
    from hisparse.gpu import ReplayPlan, bind_device
    device = bind_device(0)
    try:
        stream = cuda.Stream()
        affine = ElementwiseKernel("unsigned long *x, unsigned long a",
                                   "x[i] = 3ull * x[i] + a", "affine")
        x = gpuarray.zeros(5, np.uint64)
        plan = ReplayPlan(stream, lambda: affine(x, np.uint64(1), stream=stream),
                          lambda: affine(x, np.uint64(2), stream=stream), count, unit=unit,
                          what="test")
        stream.synchronize()
        assert np.all(x.get() == 0)  # recorded, not run
        assert plan.nodes == count
        expected, wrap = 0, 2 ** 64
        for replay in range(2):
            plan.launch()
            stream.synchronize()
            expected = (3 * expected + 1) % wrap
            for _ in range(count - 1):
                expected = (3 * expected + 2) % wrap
            assert np.all(x.get() == np.uint64(expected))
        plan.free()
    finally:
        device.release()


@pytest.mark.gpu
def test_background_work_keeps_its_kernels_low_and_raises_the_others():
    """Work issued inside ``background_work`` (two kernels on the capturing stream) stays at the
    lowest priority; the kernels forked onto a second stream and the one after the join are
    raised; the replay computes what the launches compute (order through the fork/join kept)."""
    from pycuda.elementwise import ElementwiseKernel
    import pycuda.driver as cuda
    import pycuda.gpuarray as gpuarray
    from hisparse.gpu import CapturedWork, background_work, bind_device
    device = bind_device(0)
    try:
        stream, side = cuda.Stream(), cuda.Stream()
        forked, joined = cuda.Event(), cuda.Event()
        affine = ElementwiseKernel("unsigned long *x, unsigned long a",
                                   "x[i] = 3ull * x[i] + a", "affine")
        x = gpuarray.zeros(1 << 20, np.uint64)
        y = gpuarray.zeros(1 << 10, np.uint64)

        def issue():
            forked.record(stream)
            side.wait_for_event(forked)
            affine(y, np.uint64(5), stream=side)     # raised (the "exchange")
            affine(y, np.uint64(6), stream=side)     # raised
            with background_work(stream):
                affine(x, np.uint64(1), stream=stream)  # background (the "local product")
                affine(x, np.uint64(2), stream=stream)  # background
            joined.record(side)
            stream.wait_for_event(joined)
            affine(x, np.uint64(7), stream=stream)   # raised (after the join)

        work = CapturedWork(stream, issue, "prioritised work")
        assert len(work.background) == 2
        assert work.raised == 3
        work.launch()
        stream.synchronize()
        assert np.all(x.get() == np.uint64(3 * (3 * 1 + 2) + 7))
        assert np.all(y.get() == np.uint64(3 * 5 + 6))
        work.free()
    finally:
        device.release()


@pytest.mark.parametrize("threads", [1, 3])
def test_the_staged_copy_loops_move_every_byte_in_order(threads):
    """The piece loops of the staged copies, with a host array standing in for the device:
    every byte lands where it belongs for sizes around the buffers' length (2 and 3 buffers of
    64 bytes), each buffer is refilled only after its last piece left it (upload: ``wait`` for
    that slot first; download: copied out first), with and without a pool of threads."""
    from concurrent.futures import ThreadPoolExecutor
    from hisparse.gpu import _memory
    rng = np.random.default_rng(8)
    pool = ThreadPoolExecutor(threads) if threads > 1 else None
    try:
        for count in (2, 3):
            for nbytes in (1, 63, 64, 65, 128, 64 * count + 7, 64 * 7):
                data = rng.integers(0, 256, nbytes).astype(np.uint8)
                buffers = [np.zeros(64, np.uint8) for _ in range(count)]
                in_flight = {}  # slot -> the offset whose piece the buffer holds, not yet out

                def send(slot, piece, offset):
                    assert slot not in in_flight  # waited for before the buffer was refilled
                    in_flight[slot] = offset
                    device[offset:offset + len(piece)] = piece

                def waited(slot):
                    in_flight.pop(slot, None)

                device = np.zeros(nbytes, np.uint8)
                _memory.upload_in_pieces(data, buffers, send, waited, pool, threads)
                np.testing.assert_array_equal(device, data)

                out = np.zeros(nbytes, np.uint8)
                fetched = {}

                def fetch(slot, piece, offset):
                    assert slot not in fetched  # its last piece was copied out already
                    piece[:] = data[offset:offset + len(piece)]
                    fetched[slot] = offset

                def landed(slot):
                    fetched.pop(slot)

                _memory.download_in_pieces(out, buffers, fetch, landed, pool, threads)
                np.testing.assert_array_equal(out, data)
                assert not fetched
    finally:
        if pool is not None:
            pool.shutdown()


@pytest.mark.gpu
def test_staged_uploads_land_every_byte(monkeypatch):
    """Uploads at and above STAGED_UPLOAD_MIN_BYTES go through the page-locked staging buffers
    (here shrunk to 4 KiB pieces, 3 buffers, so that every buffer is reused and pieces end
    mid-element): what comes back equals the host array for sizes around the piece boundaries,
    several dtypes and a non-contiguous source, with several threads (one thread: the driver's
    copy, no staging); a smaller upload takes the driver's copy; the arena's release closes
    the stager."""
    import pycuda.driver as cuda
    from hisparse.gpu import _memory, bind_device
    monkeypatch.setattr(_memory, "STAGING_PIECE_BYTES", 4096)
    monkeypatch.setattr(_memory, "STAGED_UPLOAD_MIN_BYTES", 4096)
    rng = np.random.default_rng(3)
    device = bind_device(0)
    try:
        for threads in (1, 3):
            monkeypatch.setattr(_memory, "staging_threads", lambda: threads)
            arena = _memory.DeviceArena("test")
            small = rng.random(511)  # 4,088 bytes: the driver's copy
            assert np.array_equal(arena.to_device(small).get(), small)
            assert arena._stager is None
            for nbytes in (4096, 4097, 3 * 4096, 7 * 4096 + 12, 40 * 4096 + 8):
                for dtype in (np.float64, np.int32, np.uint8):
                    host = rng.integers(0, 250, nbytes // np.dtype(dtype).itemsize).astype(dtype)
                    array = arena.to_device(host)
                    assert np.array_equal(array.get(), host), (threads, nbytes, dtype)
            assert (arena._stager is not None) == (threads > 1)  # one core: no staging
            strided = rng.random((300, 40))[:, ::3]  # 4,200 float64 = 33,600 bytes
            assert np.array_equal(arena.to_device(strided).get(), strided)
            stager = arena._stager
            arena.release_all()
            assert arena._stager is None and (stager is None or stager.buffers == [])
        cuda.Context.synchronize()
    finally:
        device.release()


@pytest.mark.gpu
def test_cupy_uploads_and_downloads_land_every_byte(monkeypatch):
    """host_to_device's pieces through CuPy's page-locked buffers (4 KiB here: every buffer
    reused, pieces ending mid-element), with 1 thread (the driver's copy) and 3, and host_copy's
    download into pages touched first, give back the host's bytes for sizes around the piece
    boundaries, several dtypes, an empty and a non-contiguous array."""
    import cupy
    from hisparse.gpu import _memory, host_copy, host_to_device
    monkeypatch.setattr(_memory, "STAGING_PIECE_BYTES", 4096)
    monkeypatch.setattr(_memory, "STAGED_UPLOAD_MIN_BYTES", 4096)
    rng = np.random.default_rng(5)
    for threads in (1, 3):
        monkeypatch.setattr(_memory, "staging_threads", lambda: threads)
        for nbytes in (0, 8, 4095, 4096, 4097, 3 * 4096, 7 * 4096 + 12, 40 * 4096 + 8):
            for dtype in (np.float64, np.int32, np.uint8):
                host = rng.integers(0, 250, nbytes // np.dtype(dtype).itemsize).astype(dtype)
                device = host_to_device(cupy, host)
                assert isinstance(device, cupy.ndarray) and device.dtype == dtype
                assert np.array_equal(device.get(), host), (threads, nbytes, dtype)
                back = host_copy(device)
                assert back.dtype == dtype and np.array_equal(back, host)
        strided = rng.random((300, 40))[:, ::3]
        assert np.array_equal(host_to_device(cupy, strided).get(), strided)
        assert np.array_equal(host_copy(cupy.asarray(strided)), strided)


@pytest.mark.gpu
def test_staged_downloads_land_every_byte():
    """staged_download's pieces (4 KiB here, so each of the two buffers is reused and pieces end
    mid-element) give back the device bytes for sizes around the piece boundaries and several
    dtypes, with its own buffers and with a caller's."""
    import pycuda.driver as cuda
    import pycuda.gpuarray as gpuarray
    from hisparse.gpu import _memory, bind_device
    rng = np.random.default_rng(4)
    device = bind_device(0)
    try:
        stream = cuda.Stream()
        lent = [cuda.pagelocked_empty(4096, np.uint8) for _ in range(2)]
        for nbytes in (0, 8, 4096, 4097, 3 * 4096, 7 * 4096 + 12):
            for dtype in (np.float64, np.int32, np.uint8):
                host = rng.integers(0, 250, nbytes // np.dtype(dtype).itemsize).astype(dtype)
                source = gpuarray.to_gpu(host) if host.size else None
                pointer = int(source.gpudata) if host.size else 0
                for buffers in (None, lent):
                    out = np.full_like(host, 255)
                    _memory.staged_download(pointer, out, stream, 4096, buffers)
                    assert np.array_equal(out, host), (nbytes, dtype, buffers is None)
        for buffer in lent:
            _memory.free_pinned(buffer)
        cuda.Context.synchronize()
    finally:
        device.release()


@pytest.mark.gpu
def test_capture_that_waits_on_the_host_fails_cleanly():
    """A host wait inside a capture is refused with an error naming the work, and the stream is
    usable afterwards."""
    import pycuda.driver as cuda
    import pycuda.gpuarray as gpuarray
    from hisparse.errors import HisparseError
    from hisparse.gpu import CapturedWork, bind_device
    device = bind_device(0)
    try:
        stream = cuda.Stream()
        x = gpuarray.zeros(4, np.float64)

        def waits():
            x.fill(1.0, stream=stream)
            stream.synchronize()

        with pytest.raises(HisparseError, match="the waiting work"):
            CapturedWork(stream, waits, "the waiting work")
        x.fill(2.0, stream=stream)
        stream.synchronize()
        assert np.all(x.get() == 2.0)
    finally:
        device.release()


@pytest.mark.gpu
def test_graph_cache_records_once_and_launches_failed_work_directly():
    """A key is recorded once and replayed on every later run; a key whose recording failed
    (its work waits on the host) is launched directly on every run, never recorded again, and
    its error is kept and logged once."""
    from pycuda.elementwise import ElementwiseKernel
    import pycuda.driver as cuda
    import pycuda.gpuarray as gpuarray
    from hisparse.gpu import GraphCache, bind_device
    device = bind_device(0)
    try:
        stream = cuda.Stream()
        add = ElementwiseKernel("double *x, double a", "x[i] += a", "add")
        x = gpuarray.zeros(3, np.float64)
        issued = {"good": 0, "waits": 0}

        def good():
            issued["good"] += 1
            add(x, 1.0, stream=stream)

        def waits():
            issued["waits"] += 1
            add(x, 10.0, stream=stream)
            stream.synchronize()

        lines = []
        cache = GraphCache(lines.append)
        for _ in range(3):
            cache.run("good", stream, good, "good work")
            cache.run("waits", stream, waits, "waiting work")
        stream.synchronize()
        # recorded once (no run while recording), replayed 3 times; the failed recording issued
        # the waiting work once without running it, then 3 direct launches ran it
        assert issued == {"good": 1, "waits": 4}
        assert np.all(x.get() == 3 * 1.0 + 3 * 10.0)
        assert set(cache.graphs) == {"good"} and cache.failed == {"waits"}
        assert "waiting work" in cache.error and len(lines) == 1
        cache.drop(keep=lambda key: key != "good")
        assert not cache.graphs
        cache.free()
    finally:
        device.release()


@pytest.mark.parametrize("missing", [True, False])
def test_background_library_import_never_raises_in_its_thread(monkeypatch, missing):
    """The libraries' background import (Cholesky starts it during the analysis) ends, and a
    missing CuPy or PyCUDA raises nothing in its thread: the engine that needs them reports it
    where it is used."""
    import threading

    from hisparse.errors import HisparseError
    from hisparse.gpu import _blas

    raised = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    if missing:
        def no_cupy(purpose):
            raise HisparseError(f"{purpose} needs CuPy")
        monkeypatch.setattr(_blas, "cupy_libraries", no_cupy)
    thread = _blas.start_library_import()
    thread.join(timeout=120)
    assert not thread.is_alive() and raised == []

