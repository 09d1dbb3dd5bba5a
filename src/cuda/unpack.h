// Gathering devmem-TCP receives: Google's TCPX plugin lands a CUDA receive as scattered 4 KiB
// pages of a GPU bounce buffer and describes them with loadMeta entries (NCCL's 16-byte layout,
// netDeviceType UNPACK version 7). The unpack kernel copies each entry's bytes from the bounce
// buffer to its place in the destination; unpack_reference() does the same on the CPU, for tests
// and for the emulated device layer.
//
// Both check what the transport wrote: an entry that reaches past the destination, or a count
// above kUnpackMaxEntries, is not followed (only the first kUnpackMaxEntries entries are read) and
// the receive is reported bad, so a faulty transport cannot make us write outside the buffer we
// were given.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/unpack_defs.h"
#include "tcpx/status.h"

namespace tcpx::cuda {

// The CPU reference: copies every valid entry of `entries[0, count)`; false if any was not.
bool unpack_reference(const LoadMeta* entries, uint64_t count, const uint8_t* bounce, uint8_t* dst,
                      uint64_t dst_len);

// Enqueues the unpack on `stream` (a cudaStream_t). `entries` and `count` must be device-visible,
// `entries` readable for a full slot (kUnpackMaxEntries entries, whatever the count: the kernel
// loads some ahead of knowing it); the count is read when the kernel runs, so the transport may
// write it up to then. Entries must
// not overlap in the destination. `*bad` (device-visible, may be null) is set to a non-zero value
// when the receive is bad; the kernel never clears it. `expected` is the count the caller expects
// (when it knows it): the grid is sized for that many entries, so that a small receive does not
// pay for a full slot's warps; more entries are still all copied, by fewer warps each.
Status launch_unpack(const LoadMeta* entries, const uint64_t* count, const uint8_t* bounce,
                     uint8_t* dst, uint64_t dst_len, uint32_t* bad, void* stream,
                     uint64_t expected = kUnpackMaxEntries);

}  // namespace tcpx::cuda
