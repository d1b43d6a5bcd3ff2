// common.cuh: launch helpers shared by the kernels of this workdir.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cub/block/block_reduce.cuh>  // EXPECT: KC002

// Blocks of `threads` covering n elements.
inline unsigned int blocks_for(long long n, unsigned int threads) {
  return static_cast<unsigned int>((n + threads - 1) / threads);
}
