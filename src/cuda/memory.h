// What a pointer points to, and whether this process can use a GPU at all.
#pragma once

#include <cstdint>

#include "tcpx/endpoint.h"
#include "tcpx/status.h"

namespace tcpx::cuda {

// Number of usable GPUs; 0 when there is no driver, no device, or the CUDA parts were not built.
int device_count();

struct PointerInfo {
    MemKind kind = MemKind::kHost;
    int32_t device = -1;  // for kCuda
};

// kCuda for device memory (the device it lives on), kHost for anything else: pageable or pinned
// host memory, or when CUDA is unavailable.
PointerInfo classify(const void* ptr);

}  // namespace tcpx::cuda
