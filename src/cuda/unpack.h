// Gathering devmem-TCP receives: Google's TCPX plugin lands a CUDA receive as scattered 4 KiB
// pages of a GPU bounce buffer and describes them with loadMeta entries (NCCL's 16-byte layout,
// netDeviceType UNPACK version 7). The unpack kernel copies each entry's bytes from the bounce
// buffer to its place in the destination; unpack_reference() does the same on the CPU for tests.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/unpack_defs.h"
#include "tcpx/status.h"

namespace tcpx::cuda {

// The CPU reference: copies every entry of `entries[0, count)`.
void unpack_reference(const LoadMeta* entries, uint64_t count, const uint8_t* bounce, uint8_t* dst);

// Enqueues the unpack of `*count` entries (read on the GPU when the kernel runs, so the plugin
// may write it up to the launch) from device-visible `entries`, on `stream` (a cudaStream_t).
// At most kUnpackMaxEntries entries. Entries must not overlap in the destination.
Status launch_unpack(const LoadMeta* entries, const uint64_t* count, const uint8_t* bounce,
                     uint8_t* dst, void* stream);

}  // namespace tcpx::cuda
