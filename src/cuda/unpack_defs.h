// The layout Google's TCPX plugin (and NCCL's unpack code) share for devmem-TCP receives
// (netDeviceType UNPACK, version 7). Plain data only: included by the kernel's .cu file.
#pragma once

#include <cstdint>

namespace tcpx::cuda {

inline constexpr int kUnpackQueueDepth = 16;    // slots per receive comm
inline constexpr int kUnpackMaxEntries = 2048;  // entries per slot (a 4 MiB slice + slack)
inline constexpr uint32_t kUnpackPageSize = 4096;
inline constexpr int kUnpackVersion = 7;

// One contiguous piece of a receive: `len` bytes at `src_off` in the bounce buffer belong at
// `dst_off` in the destination buffer.
struct alignas(16) LoadMeta {
    uint32_t src_off;
    uint32_t len;
    uint64_t dst_off;
};
static_assert(sizeof(LoadMeta) == 16);

// The plugin's per-comm metadata, in host memory mapped into the GPU (netUnpackMeta).
struct UnpackMeta {
    LoadMeta mem[kUnpackQueueDepth][kUnpackMaxEntries];
    uint64_t cnt[kUnpackQueueDepth];
};
static_assert(sizeof(UnpackMeta) == 524416);

// What the device handle (ncclNetDeviceHandle.handle) points to, in GPU memory
// (unpackNetDeviceHandle).
struct UnpackHandle {
    UnpackMeta* meta;     // device address of the mapped metadata
    uint8_t* bounce_buf;  // the receive page pool
    uint64_t head;        // NCCL's counter; starts at -1
};
static_assert(sizeof(UnpackHandle) == 24);

}  // namespace tcpx::cuda
