// The segment copy kernel's list entry (copy_segments.h), as plain data: host code builds these
// lists without the CUDA headers (unpack_plan.h, the emulated device layer of the tests).
#pragma once

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

}  // namespace tcpx::cuda
