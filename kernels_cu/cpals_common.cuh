// What the CP-ALS kernels (mttkrp.cu, cpals_dense.cu) share: the tensor order and CP rank they
// are compiled for (-DORDER=... -DRANK=...; these defaults let each file compile on its own).
#pragma once

#ifndef ORDER
#define ORDER 3
#endif
#ifndef RANK
#define RANK 16
#endif

static_assert(ORDER >= 2, "ORDER must be >= 2");
static_assert(RANK >= 1 && RANK <= 1024, "RANK must lie in [1, 1024]");
