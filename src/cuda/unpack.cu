// The unpack kernel. One warp copies one entry (at most a 4 KiB page): 32 lanes move the widest
// words that both ends' alignment allows (16, 8, 4, 2 or 1 bytes), eight words per lane loaded
// before any is stored, so that a whole page of 16-byte words is one round trip to memory; then
// the rest word by word and the tail byte by byte.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/unpack_kernel.h"

namespace tcpx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

template <typename Word>
__device__ __forceinline__ void copy_words(const uint8_t* __restrict__ src,
                                           uint8_t* __restrict__ dst, uint32_t len, int lane) {
    const uint32_t words = len / sizeof(Word);
    const Word* s = reinterpret_cast<const Word*>(src);
    Word* d = reinterpret_cast<Word*>(dst);
    constexpr uint32_t kUnroll = 8;
    uint32_t i = lane;
    for (; i + (kUnroll - 1) * 32 < words; i += kUnroll * 32) {
        Word r[kUnroll];
#pragma unroll
        for (uint32_t k = 0; k < kUnroll; ++k) r[k] = s[i + k * 32];
#pragma unroll
        for (uint32_t k = 0; k < kUnroll; ++k) d[i + k * 32] = r[k];
    }
    for (; i < words; i += 32) d[i] = s[i];
    for (uint32_t t = words * sizeof(Word) + lane; t < len; t += 32) dst[t] = src[t];
}

__global__ void __launch_bounds__(kThreads)
    unpack_kernel(const LoadMeta* __restrict__ entries, const uint64_t* __restrict__ count_ptr,
                  const uint8_t* __restrict__ bounce, uint8_t* __restrict__ dst, uint64_t dst_len,
                  uint32_t* bad) {
    // The warp's first entry is loaded alongside the count rather than after it (the list is
    // readable for a full slot), so that a short kernel waits for two memory round trips before
    // copying, not three. An entry past the count is dropped unused, but compute-sanitizer's
    // initcheck reports its load: built with TCPX_P2P_INITCHECK, the load waits for the count.
    const uint64_t first = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
    LoadMeta next{};
#ifndef TCPX_P2P_UNPACK_LIST_AFTER_COUNT
    if (first < kUnpackMaxEntries) next = entries[first];
#endif
    uint64_t count = *reinterpret_cast<const volatile uint64_t*>(count_ptr);
#ifdef TCPX_P2P_UNPACK_LIST_AFTER_COUNT
    if (first < count && first < kUnpackMaxEntries) next = entries[first];
#endif
    if (count > kUnpackMaxEntries) {
        if (bad != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *bad = 1;
        count = kUnpackMaxEntries;
    }
    const int lane = threadIdx.x & 31;
    const uint64_t nwarps = static_cast<uint64_t>(gridDim.x) * kWarpsPerBlock;
    for (uint64_t e = first; e < count; e += nwarps) {
        const LoadMeta m = e == first ? next : entries[e];
        // Never follow an entry outside the destination (the transport's word is not trusted).
        if (m.dst_off > dst_len || m.len > dst_len - m.dst_off) {
            if (bad != nullptr && lane == 0) *bad = 1;
            continue;
        }
        const uint8_t* s = bounce + m.src_off;
        uint8_t* d = dst + m.dst_off;
        const uintptr_t align = reinterpret_cast<uintptr_t>(s) | reinterpret_cast<uintptr_t>(d);
        if ((align & 15) == 0) {
            copy_words<uint4>(s, d, m.len, lane);
        } else if ((align & 7) == 0) {
            copy_words<uint2>(s, d, m.len, lane);
        } else if ((align & 3) == 0) {
            copy_words<uint32_t>(s, d, m.len, lane);
        } else if ((align & 1) == 0) {
            copy_words<uint16_t>(s, d, m.len, lane);
        } else {
            copy_words<uint8_t>(s, d, m.len, lane);
        }
    }
}

}  // namespace

cudaError_t launch_unpack_kernel(const LoadMeta* entries, const uint64_t* count,
                                 const uint8_t* bounce, uint8_t* dst, uint64_t dst_len,
                                 uint32_t* bad, cudaStream_t stream, uint64_t expected) {
    // One warp per expected entry (at least one block, at most a full slot's); the count itself
    // is read on the GPU, and warps go round the list if it holds more.
    if (expected == 0) expected = 1;
    if (expected > kUnpackMaxEntries) expected = kUnpackMaxEntries;
    const int blocks = static_cast<int>((expected + kWarpsPerBlock - 1) / kWarpsPerBlock);
    // (cudaLaunchKernel for its own status, as launch_copy_segments)
    void* args[] = {&entries, &count, &bounce, &dst, &dst_len, &bad};
    return cudaLaunchKernel(reinterpret_cast<const void*>(&unpack_kernel), dim3(blocks),
                            dim3(kThreads), args, 0, stream);
}

}  // namespace tcpx::cuda
