"""Experiment: the SpTV product of the nell-2-like 77M tensor as a CSR5 SpMV of its fiber matrix
(rows = fibers, columns = mode-n index), against the fiber kernels' 0.747 ms."""
import sys, time
import numpy as np
import pycuda.driver as cuda
from hisparse.gpu import bind_device, load_module, DeviceArena, KernelTable
from hisparse.gpu import Kernels
from hisparse.generators import random_tensor
from hisparse.formats import FiberTensor
from hisparse.formats import CSRMatrix
from hisparse.formats import default_sigma
from hisparse.gpu import CSR5_KERNELS, Csr5Device, csr5_defines

dev = bind_device(0)
t0 = time.perf_counter()
t = random_tensor([12092, 9184, 28818], 76879419, 0.14, 2, 7)
f = FiberTensor.from_coo(t, 2)
print("gen+fiber s", time.perf_counter() - t0, "nnz", f.nnz, "fibers", f.nfibers, flush=True)
indptr = f.fiber_ptr.astype(np.int32); indices = f.fiber_index.astype(np.int32); data = f.values
m = CSRMatrix(indptr, indices, data, (f.nfibers, 28818))
for sigma in [int(a) for a in sys.argv[1:]] or [default_sigma(f.nnz / f.nfibers)]:
    defines = csr5_defines(m, sigma)
    kern = Kernels(load_module("spmv_csr5", defines=defines), CSR5_KERNELS.signatures(defines))
    arena = DeviceArena()
    stream = cuda.Stream()
    d = Csr5Device(kern, m, sigma, stream, arena); d.load()
    a_ptr, a_ind, a_val = (arena.to_device(indptr, "p"), arena.to_device(indices, "i"), arena.to_device(data, "v"))
    c0 = time.perf_counter(); d.convert(a_ptr, a_ind, a_val); conv = time.perf_counter() - c0
    v = arena.to_device(np.random.default_rng(0).uniform(-1, 1, 28818), "v")
    y = arena.empty(f.nfibers, np.float64, "y")
    e0, e1 = cuda.Event(), cuda.Event()
    for _ in range(3):
        d.multiply(v, y)
    times = []
    for _ in range(10):
        e0.record(stream); d.multiply(v, y); e1.record(stream); e1.synchronize()
        times.append(e1.time_since(e0))
    ms = float(np.median(times))
    ref = np.zeros(f.nfibers); 
    yy = y.get()
    lens = np.diff(f.fiber_ptr)
    ref = np.add.reduceat(f.values * v.get()[f.fiber_index], f.fiber_ptr[:-1]) if f.nnz else ref
    err = np.max(np.abs(yy - ref)) / np.max(np.abs(ref))
    print(f"sigma {sigma} csr5 product {ms:.4f} ms = {2 * f.nnz / ms / 1e6:.1f} GFLOP/s convert {conv:.3f} s err {err:.2e}", flush=True)
    d.free(); arena.release_all()
dev.release()
