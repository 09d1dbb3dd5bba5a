#include "cuda/unpack_check.h"

#include <algorithm>

#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::cuda {

Status check_unpack_entries(const LoadMeta* e, uint64_t count, uint64_t want, uint64_t bounce_len,
                            std::vector<uint32_t>* scratch, uint64_t* uncovered) {
    if (count > static_cast<uint64_t>(kUnpackMaxEntries)) return Status();  // (the unpack's)
    const uint64_t n = count;
    constexpr uint64_t kPage = kUnpackPageSize;
    const auto broken = [&](uint64_t i, const char* what) {
        return protocol_error(strformat(
            "the transport's receive description is broken: entry %llu of %llu (%u bytes from "
            "%u of the bounce buffer to %llu of the chunk of %llu) %s",
            static_cast<unsigned long long>(i), static_cast<unsigned long long>(n), e[i].len,
            e[i].src_off, static_cast<unsigned long long>(e[i].dst_off),
            static_cast<unsigned long long>(want), what));
    };
    uint64_t got = 0;
    bool in_order = true;  // each entry where the one before ended (arrival order, as a rule)
    for (uint64_t i = 0; i < n; ++i) {
        const uint64_t src = e[i].src_off, len = e[i].len;
        if (len == 0) continue;
        in_order = in_order && e[i].dst_off == got;
        got += len;
        if ((src % kPage) + len > kPage) return broken(i, "crosses a page of the bounce buffer");
        if (src + len > bounce_len) return broken(i, "reads past the end of the bounce buffer");
        if (e[i].dst_off >= want || len > want - e[i].dst_off) {
            return broken(i, "runs past the end of the chunk");
        }
    }
    // (Each entry is inside the chunk: more than `want` in all is an overlap, found below.)
    if (got != want && (uncovered == nullptr || got > want)) {
        return protocol_error(strformat("received %llu bytes where the chunk has %llu",
                                        static_cast<unsigned long long>(got),
                                        static_cast<unsigned long long>(want)));
    }
    if (uncovered != nullptr) *uncovered = want - got;
    if (in_order) return Status();  // back to back from 0: exactly once each, the rest a gap
    // Exactly once each: the entries by the page their place starts in (a counting sort, the
    // entries of one page then in order), each where the one before ended. O(n + want / 4 KiB).
    const uint64_t pages = (want + kPage - 1) / kPage;
    std::vector<uint32_t>& v = *scratch;
    v.assign(2 * pages + 1 + n, 0);
    uint32_t* start = v.data();          // [pages + 1]: where each page's entries begin
    uint32_t* fill = start + pages + 1;  // [pages]: where the next one of each goes
    uint32_t* order = fill + pages;      // [n]
    for (uint64_t i = 0; i < n; ++i) {
        if (e[i].len != 0) ++start[e[i].dst_off / kPage + 1];
    }
    for (uint64_t p = 0; p < pages; ++p) start[p + 1] += start[p];
    std::copy(start, start + pages, fill);
    for (uint64_t i = 0; i < n; ++i) {
        if (e[i].len != 0) order[fill[e[i].dst_off / kPage]++] = static_cast<uint32_t>(i);
    }
    const auto by_place = [e](uint32_t a, uint32_t b) { return e[a].dst_off < e[b].dst_off; };
    uint64_t next = 0;
    for (uint64_t p = 0; p < pages; ++p) {
        if (start[p + 1] - start[p] > 1)
            std::sort(order + start[p], order + start[p + 1], by_place);
        for (uint32_t k = start[p]; k < start[p + 1]; ++k) {
            const uint32_t i = order[k];
            if (e[i].dst_off < next) return broken(i, "overlaps another entry");
            if (e[i].dst_off > next && uncovered == nullptr) {
                return broken(i, "leaves a gap before it");
            }
            next = e[i].dst_off + e[i].len;
        }
    }
    return Status();
}

}  // namespace tcpx::cuda
