// One devmem-TCP receive of a chunk of several pieces, unpacked straight into the pieces: the
// receive's entries (bounce buffer offset, offset in the chunk, length; written by the
// transport) composed with the pieces' places in the chunk, as a list for the segment copy
// kernel. One launch per chunk instead of an unpack into a staging buffer and a scatter out of it.
//
// The entries are the transport's words, not trusted: an entry that reaches outside the chunk is
// not followed and the receive is reported bad, as the unpack kernel does (unpack.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "cuda/copy_defs.h"
#include "cuda/device.h"
#include "cuda/unpack_defs.h"

namespace tcpx::cuda {

struct UnpackPlan {
    bool fits = true;  // false: more copies than `capacity`; nothing usable was planned
    bool bad = false;  // some entry reached outside the chunk, or the count exceeded a slot's
    size_t count = 0;  // entries written to `out`
};

// Plans the copies of `entries[0, count)` (at most kUnpackMaxEntries are read) from `bounce`
// into `segs`, the chunk's pieces back to back. Each copy stays inside one piece and is at most
// kCopyTile bytes. `starts` is scratch (the pieces' offsets in the chunk).
UnpackPlan plan_unpack_scatter(const LoadMeta* entries, uint64_t count, const uint8_t* bounce,
                               std::span<const Seg> segs, CopyEntry* out, size_t capacity,
                               std::vector<uint64_t>* starts);

// Runs a plan on the CPU (tests, and the emulated device layer).
void run_copy_entries(const CopyEntry* entries, size_t count);

}  // namespace tcpx::cuda
