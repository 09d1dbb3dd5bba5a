// The unpack kernel's launcher, free of library types so that the .cu file compiles with nvcc's
// front end alone. Use launch_unpack() (unpack.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/unpack_defs.h"

namespace tcpx::cuda {

cudaError_t launch_unpack_kernel(const LoadMeta* entries, const uint64_t* count,
                                 const uint8_t* bounce, uint8_t* dst, uint64_t dst_len,
                                 uint32_t* bad, cudaStream_t stream, uint64_t expected);

}  // namespace tcpx::cuda
