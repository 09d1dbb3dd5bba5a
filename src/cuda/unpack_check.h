// The check of a devmem-TCP receive's entries (where each piece of the chunk lies in the bounce
// buffer, and where it goes) before the unpack kernel follows them. The entries are the
// transport plugin's words: a broken plugin's garbage must not have the kernel read past the
// bounce buffer (a fault ends every CUDA call of the process) or leave bytes of the chunk
// unwritten while the receive is reported whole.
#pragma once

#include <cstdint>
#include <vector>

#include "cuda/unpack_defs.h"
#include "tcpx/status.h"

namespace tcpx::cuda {

// OK when entries[0, count) describe a chunk of `want` bytes: each entry reads inside one 4 KiB
// page of the bounce buffer (devmem-TCP hands out pages; an entry is a fragment of one) and
// inside its first `bounce_len` bytes, and sorted by their place in the chunk none starts before
// the one before ended, none ends past `want` (no overlap, nothing past the end). Empty entries
// are ignored. PROTOCOL otherwise, naming the entry. A count past kUnpackMaxEntries is left to
// the unpack, which refuses it. `scratch` keeps its memory from call to call. O(count + want /
// 4 KiB): a counting sort by page, then each page's few entries.
//
// Gaps: with `uncovered` null, the entries must cover the chunk exactly (a gap is PROTOCOL).
// Otherwise a gap is taken as bytes the transport placed in the receive buffer itself, and
// `*uncovered` says how many: Google's plugin copies data that arrived outside the GPU's pages
// (SCM_DEVMEM_HEADER: the NIC did not split a packet, or steered it to a host queue) straight
// to its place in the buffer given to irecv, and lists only the rest. A plugin that left entries
// out would leave those bytes unwritten, unseen: that much is trusted to the plugin, as NCCL
// trusts it (its kernel copies the entries and nothing else).
Status check_unpack_entries(const LoadMeta* entries, uint64_t count, uint64_t want,
                            uint64_t bounce_len, std::vector<uint32_t>* scratch,
                            uint64_t* uncovered = nullptr);

}  // namespace tcpx::cuda
