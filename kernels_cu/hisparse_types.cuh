// Value and index types of every hisparse kernel, chosen at compile time: the runtime passes
// -DVALUE_T=float|double and -DINDEX_T=int|"long long"; these defaults let each .cu file compile
// on its own (as the CI check with nvcc -cubin -arch=sm_90 does).
#pragma once

#ifndef VALUE_T
#define VALUE_T double
#endif
#ifndef INDEX_T
#define INDEX_T int
#endif
