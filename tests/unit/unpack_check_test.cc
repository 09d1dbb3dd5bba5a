// The check of a devmem-TCP receive's entries before the unpack kernel follows them
// (cuda/unpack_check.h): lists as a real plugin makes them pass in any order; every way of
// reading outside the bounce buffer, placing bytes outside the chunk, or leaving a gap or an
// overlap is refused, naming the entry.
#include "cuda/unpack_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace tcpx::cuda {
namespace {

constexpr uint64_t kPage = kUnpackPageSize;
constexpr uint64_t kPool = 64 << 20;

// A chunk of `want` bytes as pieces of whole pages and page fragments from random pages of the
// pool, in the order they arrived (as the plugin writes them), or shuffled.
std::vector<LoadMeta> plugin_list(uint64_t want, std::mt19937_64& rng, bool shuffled) {
    std::vector<LoadMeta> out;
    uint64_t at = 0;
    while (at < want) {
        const uint64_t page = rng() % (kPool / kPage);
        const uint64_t in_page = rng() % 2 == 0 ? 0 : rng() % kPage;
        const uint64_t len = std::min<uint64_t>(want - at, kPage - in_page);
        out.push_back(LoadMeta{static_cast<uint32_t>(page * kPage + in_page),
                               static_cast<uint32_t>(len), at});
        at += len;
    }
    if (shuffled) std::shuffle(out.begin(), out.end(), rng);
    return out;
}

Status check(const std::vector<LoadMeta>& e, uint64_t want, uint64_t bounce_len = kPool) {
    std::vector<uint32_t> scratch;
    return check_unpack_entries(e.data(), e.size(), want, bounce_len, &scratch);
}

TEST(UnpackCheck, WhatAPluginMakesPassesInAnyOrder) {
    std::mt19937_64 rng(7);
    for (uint64_t want : {uint64_t{1}, kPage, kPage + 1, uint64_t{64} << 10, uint64_t{4} << 20}) {
        for (bool shuffled : {false, true}) {
            const auto e = plugin_list(want, rng, shuffled);
            const Status st = check(e, want);
            EXPECT_TRUE(st.ok()) << want << " " << shuffled << ": " << st.to_string();
        }
    }
    // Nothing at all, and empty entries anywhere (they are ignored, whatever they say).
    EXPECT_TRUE(check({}, 0).ok());
    auto e = plugin_list(10000, rng, true);
    e.insert(e.begin() + 1, LoadMeta{0xffffffffu, 0, ~uint64_t{0}});
    EXPECT_TRUE(check(e, 10000).ok());
    // Past kUnpackMaxEntries: the unpack's to refuse.
    std::vector<LoadMeta> many(kUnpackMaxEntries + 1, LoadMeta{0, 1, 0});
    EXPECT_TRUE(check(many, 5).ok());
}

// Each broken list fails with PROTOCOL, naming what is wrong.
void expect_refused(const std::vector<LoadMeta>& e, uint64_t want, const char* why,
                    uint64_t bounce_len = kPool) {
    const Status st = check(e, want, bounce_len);
    ASSERT_FALSE(st.ok()) << why;
    EXPECT_EQ(st.code(), StatusCode::kProtocol);
    EXPECT_NE(st.message().find(why), std::string::npos) << st.to_string();
}

TEST(UnpackCheck, ReadsOutsideTheBounceBufferAreRefused) {
    std::mt19937_64 rng(8);
    const uint64_t want = 64 << 10;
    auto e = plugin_list(want, rng, false);
    auto cross = e;
    cross[3].src_off = static_cast<uint32_t>((cross[3].src_off / kPage) * kPage + kPage - 1);
    cross[3].len = std::max<uint32_t>(cross[3].len, 2);
    expect_refused(cross, want, "crosses a page");
    auto past = e;
    past[0].src_off = 0xfffff000u;
    expect_refused(past, want, "past the end of the bounce buffer");
    // The last page of the pool is read; the one after it is not there.
    auto last = e;
    last[5].src_off = static_cast<uint32_t>(kPool - last[5].len);
    EXPECT_TRUE(check(last, want).ok());
    last[5].src_off = static_cast<uint32_t>(kPool);
    expect_refused(last, want, "past the end of the bounce buffer");
}

TEST(UnpackCheck, PlacesOutsideTheChunkGapsAndOverlapsAreRefused) {
    std::mt19937_64 rng(9);
    const uint64_t want = 256 << 10;
    const auto e = plugin_list(want, rng, false);
    auto beyond = e;
    beyond[0].dst_off = want + (uint64_t{1} << 32);
    expect_refused(beyond, want, "runs past the end of the chunk");
    auto wrap = e;
    wrap[0].dst_off = ~uint64_t{0} - 10;  // + len wraps around
    expect_refused(wrap, want, "runs past the end of the chunk");
    auto overlap = e;
    overlap[1].dst_off = overlap[0].dst_off;  // the lengths still add up
    std::shuffle(overlap.begin(), overlap.end(), rng);
    expect_refused(overlap, want, "overlaps another entry");
    auto gap = e;  // one entry moved one byte on: a gap before it, an overlap after
    gap[4].dst_off += 1;
    expect_refused(gap, want, "leaves a gap");
    auto twice = e;  // the same entry twice, the last left out
    twice.back() = twice[2];
    twice.back().len = static_cast<uint32_t>(e.back().len);
    expect_refused(twice, want, "overlaps");
    auto shorter = e;
    shorter.pop_back();
    expect_refused(shorter, want, "received");
    auto longer = e;
    longer.push_back(LoadMeta{0, 1, want - 1});
    expect_refused(longer, want, "received");
}

// Where the caller takes gaps as bytes the transport placed itself (Google's plugin, for data
// the NIC left in host memory): entries missing anywhere pass, the bytes they leave counted;
// everything else is refused as before (an overlap, a place past the chunk, too many bytes).
TEST(UnpackCheck, GapsPassWhereTheTransportPlacesBytesItself) {
    std::mt19937_64 rng(10);
    const uint64_t want = 256 << 10;
    for (bool shuffled : {false, true}) {
        auto e = plugin_list(want, rng, false);
        uint64_t left_out = 0;
        std::vector<LoadMeta> listed;
        for (size_t i = 0; i < e.size(); ++i) {
            // The first, every third, and the last: gaps at both ends and between.
            if (i % 3 == 0 || i + 1 == e.size()) {
                left_out += e[i].len;
            } else {
                listed.push_back(e[i]);
            }
        }
        if (shuffled) std::shuffle(listed.begin(), listed.end(), rng);
        std::vector<uint32_t> scratch;
        uint64_t uncovered = 12345;
        const Status st =
            check_unpack_entries(listed.data(), listed.size(), want, kPool, &scratch, &uncovered);
        EXPECT_TRUE(st.ok()) << st.to_string();
        EXPECT_EQ(uncovered, left_out);
        EXPECT_FALSE(check(listed, want).ok()) << "refused where gaps are not taken";
        // Nothing listed at all: every byte placed by the transport.
        EXPECT_TRUE(check_unpack_entries(nullptr, 0, want, kPool, &scratch, &uncovered).ok());
        EXPECT_EQ(uncovered, want);
        auto overlap = listed;
        overlap.push_back(listed[listed.size() / 2]);
        EXPECT_FALSE(
            check_unpack_entries(overlap.data(), overlap.size(), want, kPool, &scratch, &uncovered)
                .ok());
        auto past = listed;
        past[0].dst_off = want;
        EXPECT_FALSE(
            check_unpack_entries(past.data(), past.size(), want, kPool, &scratch, &uncovered).ok());
    }
}

}  // namespace
}  // namespace tcpx::cuda
