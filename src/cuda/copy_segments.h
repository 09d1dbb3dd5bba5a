// The segment copy kernel: gathers scattered GPU memory into one buffer, or scatters one buffer
// into scattered GPU memory (a chunk of many pieces, cuda/device.h CopyRing::gather/scatter).
// Free of library types so that the .cu file compiles with nvcc's front end alone.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/copy_defs.h"

namespace tcpx::cuda {

// Enqueues the copy of `count` entries (device memory, readable when the kernel runs) on
// `stream`. Entries must not overlap in their destinations.
cudaError_t launch_copy_segments(const CopyEntry* entries, uint32_t count, cudaStream_t stream);

}  // namespace tcpx::cuda
