#include "cuda/memory.h"

#include <cuda_runtime.h>

namespace tcpx::cuda {

int device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky error for later calls
        return 0;
    }
    return n;
}

PointerInfo classify(const void* ptr) {
    PointerInfo info;
    if (ptr == nullptr || device_count() == 0) return info;
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
        cudaGetLastError();
        return info;
    }
    if (attr.type == cudaMemoryTypeDevice) {
        info.kind = MemKind::kCuda;
        info.device = attr.device;
    }
    return info;
}

}  // namespace tcpx::cuda
