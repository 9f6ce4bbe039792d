#!/bin/bash
# Stop 61: why NumPy's import takes 0.18-0.42 s of a rank's start-up on the GPU hosts (0.05 s on
# the development host): the import's own steps (-X importtime, the 12 slowest), the BLAS it
# loads, and the import with the BLAS's threads capped; Python's bare start for scale.
echo "== python3 -c pass / -S / -I"
for f in "" "-S" "-I"; do /usr/bin/time -f "python3 $f: %e s" python3 $f -c pass; done
echo "== numpy import, 3 times"
for i in 1 2 3; do python3 -c "import time; t=time.perf_counter(); import numpy; print('numpy %.3f s' % (time.perf_counter()-t))"; done
echo "== with OPENBLAS_NUM_THREADS=1 / OMP_NUM_THREADS=1"
for i in 1 2; do OPENBLAS_NUM_THREADS=1 python3 -c "import time; t=time.perf_counter(); import numpy; print('numpy openblas1 %.3f s' % (time.perf_counter()-t))"; done
for i in 1 2; do OMP_NUM_THREADS=1 python3 -c "import time; t=time.perf_counter(); import numpy; print('numpy omp1 %.3f s' % (time.perf_counter()-t))"; done
echo "== importtime numpy (slowest 12, cumulative us)"
python3 -X importtime -c "import numpy" 2>&1 | sort -t'|' -k2 -n | tail -12
echo "== importtime self (slowest 8, self us)"
python3 -X importtime -c "import numpy" 2>&1 | sort -t'|' -k1.13 -n | tail -8
python3 -c "import numpy, sys; print(numpy.__version__, numpy.__file__); numpy.show_config()" 2>&1 | grep -iE "version|name|openblas|mkl|lib" | head -12
python3 -c "import sys; print(sys.version); print(sys.path)"
