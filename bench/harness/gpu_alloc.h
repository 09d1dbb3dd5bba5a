// GPU memory for the benchmarks (`--mem vram`), straight from the CUDA runtime: the engine never
// allocates user memory, so its device layer has no allocator. Built with the CUDA parts only
// (TCPX_P2P_HAVE_CUDA).
#pragma once

#include <cstdint>

#include "tcpx/status.h"

namespace tcpx::bench {

// cudaMalloc of `len` bytes on GPU `gpu`.
StatusOr<void*> gpu_malloc(int gpu, uint64_t len);
// cudaMemset of `len` bytes at `ptr`, memory of GPU `gpu`; synchronous.
Status gpu_memset(int gpu, void* ptr, uint8_t value, uint64_t len);
// cudaFree of what gpu_malloc(gpu, ...) returned.
void gpu_free(int gpu, void* ptr);

}  // namespace tcpx::bench
