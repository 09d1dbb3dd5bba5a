#include "cuda/unpack_plan.h"

#include <algorithm>
#include <cstring>

namespace tcpx::cuda {

UnpackPlan plan_unpack_scatter(const LoadMeta* entries, uint64_t count, const uint8_t* bounce,
                               std::span<const Seg> segs, CopyEntry* out, size_t capacity,
                               std::vector<uint64_t>* starts) {
    UnpackPlan plan;
    if (count > static_cast<uint64_t>(kUnpackMaxEntries)) {
        plan.bad = true;
        count = kUnpackMaxEntries;
    }
    starts->clear();
    uint64_t total = 0;
    for (const Seg& s : segs) {
        starts->push_back(total);
        total += s.len;
    }
    size_t k = 0;
    for (uint64_t e = 0; e < count; ++e) {
        // One read of the entry: the transport may still be writing the list it handed over.
        LoadMeta m;
        std::memcpy(&m, entries + e, sizeof(m));
        if (m.dst_off > total || m.len > total - m.dst_off) {
            plan.bad = true;
            continue;
        }
        uint64_t at = m.dst_off;
        uint64_t src = m.src_off;
        uint64_t left = m.len;
        if (left == 0) continue;
        // The piece holding `at` (1-based k): a devmem receive lists its pages in order, so
        // usually the piece the last entry ended in or the next one; otherwise the last piece
        // starting at or before `at` (zero-length pieces hold nothing and are stepped over).
        if (k == 0 || at < (*starts)[k - 1] || at > (*starts)[k - 1] + segs[k - 1].len) {
            k = static_cast<size_t>(std::upper_bound(starts->begin(), starts->end(), at) -
                                    starts->begin());
        }
        while (left > 0) {
            while (k > 0 && (*starts)[k - 1] + segs[k - 1].len <= at) ++k;  // past empty ones
            const Seg& s = segs[k - 1];
            const uint64_t in_piece = at - (*starts)[k - 1];
            const uint64_t len = std::min({left, s.len - in_piece, kCopyTile});
            if (plan.count == capacity) {
                plan.fits = false;
                return plan;
            }
            out[plan.count++] = CopyEntry{reinterpret_cast<uint64_t>(bounce + src),
                                          reinterpret_cast<uint64_t>(s.ptr + in_piece), len, 0};
            at += len;
            src += len;
            left -= len;
        }
    }
    return plan;
}

void run_copy_entries(const CopyEntry* entries, size_t count) {
    for (size_t i = 0; i < count; ++i) {
        std::memcpy(reinterpret_cast<void*>(entries[i].dst),
                    reinterpret_cast<const void*>(entries[i].src), entries[i].len);
    }
}

}  // namespace tcpx::cuda
