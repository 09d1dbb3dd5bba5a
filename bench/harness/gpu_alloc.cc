#include "bench/harness/gpu_alloc.h"

#include <cuda_runtime.h>

#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::bench {
namespace {

Status cuda_check(cudaError_t err, const std::string& what) {
    if (err == cudaSuccess) return Status();
    cudaGetLastError();  // a non-sticky error must not surface in a later call
    return Status(StatusCode::kCuda, what + ": " + cudaGetErrorString(err));
}

}  // namespace

StatusOr<void*> gpu_malloc(int gpu, uint64_t len) {
    TCPX_RETURN_IF_ERROR(cuda_check(cudaSetDevice(gpu), strformat("cudaSetDevice(%d)", gpu)));
    void* ptr = nullptr;
    TCPX_RETURN_IF_ERROR(
        cuda_check(cudaMalloc(&ptr, len),
                   strformat("cudaMalloc of %s on GPU %d", format_bytes(len).c_str(), gpu)));
    return ptr;
}

Status gpu_memset(int gpu, void* ptr, uint8_t value, uint64_t len) {
    TCPX_RETURN_IF_ERROR(cuda_check(cudaSetDevice(gpu), strformat("cudaSetDevice(%d)", gpu)));
    return cuda_check(cudaMemset(ptr, value, len), strformat("cudaMemset on GPU %d", gpu));
}

void gpu_free(int gpu, void* ptr) {
    if (ptr == nullptr) return;
    cudaSetDevice(gpu);
    cudaFree(ptr);
    cudaGetLastError();
}

}  // namespace tcpx::bench
