// The plan of an unpack straight into a chunk's pieces (cuda/unpack_plan.h) over entries a
// transport wrote (devmem-TCP loadMeta: bounce offset, offset in the chunk, length; not trusted)
// and piece lengths a peer named: every planned copy stays inside one piece and inside the bounce
// buffer the entries could name, is at most a tile, an entry reaching outside the chunk is
// reported, and running the plan (AddressSanitizer watching) writes nothing else. Also the check
// made before any unpack (cuda/unpack_check.h) against a plain reference: each entry inside one
// page and inside the bounce buffer, and, sorted by place, the entries tiling the chunk.
//
// Input: u16 piece count n, n × u16 piece lengths, then 16-byte entries (LoadMeta layout).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "cuda/unpack_check.h"
#include "cuda/unpack_plan.h"
#include "fuzz_check.h"

namespace c = tcpx::cuda;

namespace {

// What check_unpack_entries must say, the plain way: every interval sorted at once.
// With `gaps`, bytes the entries leave out are the transport's (check_unpack_entries' `uncovered`).
bool reference_check(const std::vector<c::LoadMeta>& entries, uint64_t want, uint64_t bounce_len,
                     bool gaps = false, uint64_t* uncovered = nullptr) {
    if (entries.size() > static_cast<size_t>(c::kUnpackMaxEntries)) return true;  // (the unpack's)
    std::vector<std::pair<uint64_t, uint64_t>> places;                            // (dst_off, len)
    uint64_t got = 0;
    for (const c::LoadMeta& m : entries) {
        got += m.len;
        if (m.len == 0) continue;
        if (m.src_off % c::kUnpackPageSize + m.len > c::kUnpackPageSize) return false;
        if (uint64_t{m.src_off} + m.len > bounce_len) return false;
        if (m.dst_off >= want || m.len > want - m.dst_off) return false;
        places.emplace_back(m.dst_off, m.len);
    }
    if (got != want && (!gaps || got > want)) return false;
    std::sort(places.begin(), places.end());
    uint64_t next = 0;
    for (const auto& [off, len] : places) {
        if (off < next || (off > next && !gaps)) return false;
        next = off + len;
    }
    if (uncovered != nullptr) *uncovered = want - got;
    return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 2) return 0;
    uint16_t n = 0;
    std::memcpy(&n, data, 2);
    n %= 1100;
    size_t at = 2;
    if (size - at < 2u * n) return 0;
    std::vector<std::vector<uint8_t>> pieces(n);
    std::vector<c::Seg> segs(n);
    uint64_t total = 0;
    for (uint16_t i = 0; i < n; ++i, at += 2) {
        uint16_t len = 0;
        std::memcpy(&len, data + at, 2);
        pieces[i].resize(len);  // separate allocations: ASan sees a copy that leaves one
        segs[i] = c::Seg{pieces[i].data(), len, 0};
        total += len;
    }
    std::vector<c::LoadMeta> entries((size - at) / sizeof(c::LoadMeta));
    if (!entries.empty()) std::memcpy(entries.data(), data + at, entries.size() * 16);
    // The bounce buffer any entry could name: a u32 offset plus a length within the chunk.
    uint64_t reach = 0;
    for (const c::LoadMeta& m : entries) {
        if (m.dst_off <= total && m.len <= total - m.dst_off) {
            reach = std::max<uint64_t>(reach, uint64_t{m.src_off} + m.len);
        }
    }
    // The check before any unpack agrees with the reference, for a chunk of all the pieces' bytes
    // in a 1 MiB bounce buffer.
    {
        std::vector<uint32_t> scratch;
        const tcpx::Status st =
            c::check_unpack_entries(entries.data(), entries.size(), total, 1 << 20, &scratch);
        FUZZ_CHECK(st.ok() == reference_check(entries, total, 1 << 20));
        // And where gaps are the transport's: the same verdict, the same bytes left out.
        uint64_t uncovered = 0, expected = 0;
        const tcpx::Status gaps = c::check_unpack_entries(entries.data(), entries.size(), total,
                                                          1 << 20, &scratch, &uncovered);
        FUZZ_CHECK(gaps.ok() == reference_check(entries, total, 1 << 20, true, &expected));
        if (gaps.ok() && entries.size() <= static_cast<size_t>(c::kUnpackMaxEntries)) {
            FUZZ_CHECK(uncovered == expected);
        }
    }
    if (reach > (64u << 20)) return 0;  // (a real bounce buffer is that large; skip the memory)
    std::vector<uint8_t> bounce(reach);
    std::vector<c::CopyEntry> list(c::kUnpackMaxEntries + c::kMaxKernelSegs + 65);
    std::vector<uint64_t> starts;
    const c::UnpackPlan plan = c::plan_unpack_scatter(entries.data(), entries.size(), bounce.data(),
                                                      segs, list.data(), list.size(), &starts);
    FUZZ_CHECK(plan.count <= list.size());
    bool any_bad = entries.size() > static_cast<size_t>(c::kUnpackMaxEntries);
    for (size_t e = 0; e < entries.size() && e < static_cast<size_t>(c::kUnpackMaxEntries); ++e) {
        const c::LoadMeta& m = entries[e];
        if (m.dst_off > total || m.len > total - m.dst_off) any_bad = true;
    }
    if (plan.fits) FUZZ_CHECK(plan.bad == any_bad);
    for (size_t i = 0; i < plan.count; ++i) {
        const c::CopyEntry& e = list[i];
        FUZZ_CHECK(e.len > 0 && e.len <= c::kCopyTile);
        bool inside = false;
        for (const c::Seg& s : segs) {
            const uint64_t lo = reinterpret_cast<uint64_t>(s.ptr);
            if (s.len > 0 && e.dst >= lo && e.dst + e.len <= lo + s.len) inside = true;
        }
        FUZZ_CHECK(inside);
        const uint64_t b = reinterpret_cast<uint64_t>(bounce.data());
        FUZZ_CHECK(e.src >= b && e.src + e.len <= b + bounce.size());
    }
    if (plan.fits) c::run_copy_entries(list.data(), plan.count);
    return 0;
}
