"""Where the CSR5 conversion's time goes (issue 13): the conversion of a 27-point Poisson matrix
on the GPU, each kernel timed by CUDA events, the allocations and the waits by the host clock,
against one product's median time (the SpMV-equivalents of the results file). Each conversion
gets a fresh arena, so its allocations are cold as in a run's setup. Usage, on the GPU machine:

    python jobs/csr5_convert_profile.py [N ...]     (grid edges, default 32 160)
"""
import sys
import time

import numpy as np


def profile(n, reps=3, products=30):
    import pycuda.driver as cuda
    from hisparse.formats import build_csr5, default_sigma
    from hisparse.generators import poisson
    from hisparse.gpu import DeviceArena, Kernels, load_module
    from hisparse.gpu import CSR5_KERNELS, Csr5Device, csr5_defines

    start = time.perf_counter()
    csr = poisson([n, n, n], 27)
    csr = type(csr)(csr.indptr.astype(np.int32), csr.indices.astype(np.int32), csr.data,
                    csr.shape)
    sigma = default_sigma(csr.nnz / csr.nrows)
    print(f"27-pt {n}^3: {csr.nrows} rows, {csr.nnz} nnz, sigma {sigma}, "
          f"generated in {time.perf_counter() - start:.1f} s", flush=True)
    defines = csr5_defines(csr, sigma)
    kernels = Kernels(load_module("spmv_csr5", defines), CSR5_KERNELS.signatures(defines))
    stream = cuda.Stream()

    def fresh(instrument=False):
        arena = DeviceArena("csr5 profile")
        device = Csr5Device(kernels, csr, sigma, stream, arena)
        device.load()
        arrays = [arena.to_device(a) for a in (csr.indptr, csr.indices, csr.data)]
        cuda.Context.synchronize()
        if instrument:
            _instrument(device, arena)
        return device, arena, arrays

    walls, steps = [], []
    for _ in range(reps):
        device, arena, arrays = fresh()
        begin = time.perf_counter()
        device.convert(*arrays)
        walls.append(time.perf_counter() - begin)
        steps.append(device.convert_steps)
        if n <= 64 and not steps[1:]:
            got, want = device.to_host(), build_csr5(csr, sigma)
            same = all(np.array_equal(getattr(got, k), getattr(want, k)) for k in (
                "tile_ptr", "tile_desc", "col_idx", "val", "offset_ptr", "empty_offset",
                "chain_row", "chain_first", "chain_last"))
            print(f"  to_host() equals build_csr5: {same}")
        device.free()
        arena.release_all()

    device, arena, arrays = fresh(instrument=True)
    device.convert(*arrays)
    timeline = device.profile_log
    x = arena.to_device(np.random.default_rng(0).uniform(-1, 1, csr.ncols))
    y = arena.empty(csr.nrows, np.float64)
    begin, end = cuda.Event(), cuda.Event()
    times = []
    for i in range(products + 3):
        begin.record(stream)
        device.multiply(x, y)
        end.record(stream)
        end.synchronize()
        if i >= 3:
            times.append(end.time_since(begin) * 1e-3)
    product = float(np.median(times))
    reference = csr.to_scipy() @ x.get()
    error = float(np.max(np.abs(y.get() - reference)) / np.max(np.abs(reference)))
    device.free()
    arena.release_all()

    median = float(np.median(walls))
    print(f"  product {product * 1e3:.4f} ms (max rel. error {error:.1e}); conversion wall "
          f"{', '.join(f'{w * 1e3:.3f}' for w in walls)} ms, median {median * 1e3:.3f} ms = "
          f"{median / product:.2f} SpMV-equivalents")
    for name in steps[0]:
        print(f"    step {name}: " + ", ".join(f"{s[name] * 1e3:.3f}" for s in steps) + " ms")
    print("  instrumented run (events around each launch; host ms of allocations):")
    for line in timeline:
        print("    " + line)


def _instrument(device, arena):
    """Record events around each of ``device``'s launches and time each allocation."""
    import pycuda.driver as cuda
    device.profile_log = log = []
    pending = []
    launch, alloc = device._launch, arena.alloc

    def timed_launch(name, *args, **kwargs):
        events = cuda.Event(), cuda.Event()
        events[0].record(device.stream)
        launch(name, *args, **kwargs)
        events[1].record(device.stream)
        pending.append((name, events))

    def timed_alloc(nbytes, what="buffer"):
        begin = time.perf_counter()
        buffer = alloc(nbytes, what)
        log.append(f"alloc {what} {nbytes / 2**20:.2f} MiB: "
                   f"{(time.perf_counter() - begin) * 1e3:.3f} ms host")
        return buffer

    convert = device.convert

    def timed_convert(*args):
        begin = time.perf_counter()
        convert(*args)
        wall = time.perf_counter() - begin
        arena.alloc = alloc
        for name, (start, end) in pending:
            end.synchronize()
            log.append(f"kernel {name}: {end.time_since(start):.4f} ms device")
        log.append(f"convert wall (instrumented) {wall * 1e3:.3f} ms; steps " + ", ".join(
            f"{k} {v * 1e3:.3f}" for k, v in device.convert_steps.items()))

    device._launch, arena.alloc, device.convert = timed_launch, timed_alloc, timed_convert


def main(arguments):
    from hisparse.gpu import bind_device
    device = bind_device(0)
    try:
        for n in [int(a) for a in arguments] or [32, 160]:
            profile(n)
    finally:
        device.release()


if __name__ == "__main__":
    main(sys.argv[1:])
