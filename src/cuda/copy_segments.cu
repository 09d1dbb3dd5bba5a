// The segment copy kernel. One block copies one entry (at most kCopyTile bytes): its threads move
// the widest words that both ends' alignment allows, four loaded before any is stored, then the
// tail byte by byte.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/copy_segments.h"

namespace tcpx::cuda {
namespace {

constexpr int kThreads = 256;

template <typename Word>
__device__ __forceinline__ void copy_block(const uint8_t* __restrict__ src,
                                           uint8_t* __restrict__ dst, uint64_t len) {
    const uint64_t words = len / sizeof(Word);
    const Word* s = reinterpret_cast<const Word*>(src);
    Word* d = reinterpret_cast<Word*>(dst);
    constexpr uint64_t kUnroll = 4;
    uint64_t i = threadIdx.x;
    for (; i + (kUnroll - 1) * kThreads < words; i += kUnroll * kThreads) {
        Word r[kUnroll];
#pragma unroll
        for (uint64_t k = 0; k < kUnroll; ++k) r[k] = s[i + k * kThreads];
#pragma unroll
        for (uint64_t k = 0; k < kUnroll; ++k) d[i + k * kThreads] = r[k];
    }
    for (; i < words; i += kThreads) d[i] = s[i];
    for (uint64_t t = words * sizeof(Word) + threadIdx.x; t < len; t += kThreads) dst[t] = src[t];
}

__global__ void __launch_bounds__(kThreads)
    copy_segments_kernel(const CopyEntry* __restrict__ entries, uint32_t count) {
    for (uint32_t e = blockIdx.x; e < count; e += gridDim.x) {
        const CopyEntry m = entries[e];
        const uint8_t* s = reinterpret_cast<const uint8_t*>(m.src);
        uint8_t* d = reinterpret_cast<uint8_t*>(m.dst);
        const uint64_t align = m.src | m.dst;
        if ((align & 15) == 0) {
            copy_block<uint4>(s, d, m.len);
        } else if ((align & 7) == 0) {
            copy_block<uint2>(s, d, m.len);
        } else if ((align & 3) == 0) {
            copy_block<uint32_t>(s, d, m.len);
        } else {
            copy_block<uint8_t>(s, d, m.len);
        }
    }
}

}  // namespace

cudaError_t launch_copy_segments(const CopyEntry* entries, uint32_t count, cudaStream_t stream) {
    if (count == 0) return cudaSuccess;
    const uint32_t blocks = count < 4096 ? count : 4096;
    // Launched through cudaLaunchKernel for its own status: cudaGetLastError() after <<<>>>
    // would report (and clear) an error the application's thread left pending as this launch's.
    void* args[] = {&entries, &count};
    return cudaLaunchKernel(reinterpret_cast<const void*>(&copy_segments_kernel), dim3(blocks),
                            dim3(kThreads), args, 0, stream);
}

}  // namespace tcpx::cuda
