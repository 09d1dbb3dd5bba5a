// The segment copy kernel: gathers scattered GPU memory into one buffer, or scatters one buffer
// into scattered GPU memory (a chunk of many pieces, cuda/device.h CopyRing::gather/scatter).
// Free of library types so that the .cu file compiles with nvcc's front end alone.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tcpx::cuda {

// One copy: `len` bytes from `src` to `dst`, both device-visible.
struct alignas(16) CopyEntry {
    uint64_t src;
    uint64_t dst;
    uint64_t len;
    uint64_t pad;
};
static_assert(sizeof(CopyEntry) == 32);

// Entries longer than this are split by the caller, so that the work spreads over many blocks.
inline constexpr uint64_t kCopyTile = 64 * 1024;

// Enqueues the copy of `count` entries (device memory, readable when the kernel runs) on
// `stream`. Entries must not overlap in their destinations.
cudaError_t launch_copy_segments(const CopyEntry* entries, uint32_t count, cudaStream_t stream);

}  // namespace tcpx::cuda
