// SlotFifo (common/slot_fifo.h): records in FIFO order, and allocations of an arena that never
// overlap a live one, stay inside the arena, and reuse space as the oldest are given back.
#include "common/slot_fifo.h"

#include <gtest/gtest.h>

#include <deque>
#include <random>

namespace tcpx {
namespace {

TEST(SlotFifo, RecordsOnlyAreFifo) {
    SlotFifo f(3);
    EXPECT_TRUE(f.has_free());
    const int a = f.acquire(), b = f.acquire(), c = f.acquire();
    EXPECT_FALSE(f.has_free());
    EXPECT_FALSE(f.release(b));  // not the oldest
    EXPECT_TRUE(f.release(a));
    EXPECT_EQ(f.acquire(), a);  // reused round the ring
    EXPECT_TRUE(f.release(b));
    EXPECT_TRUE(f.release(c));
    EXPECT_TRUE(f.release(a));
    EXPECT_FALSE(f.release(a));
}

TEST(SlotFifo, SmallAllocationsShareTheArena) {
    SlotFifo f(16, 4 << 20);  // room for four 1 MiB allocations
    for (int i = 0; i < 4; ++i) {
        ASSERT_TRUE(f.has_free(1 << 20));
        const int s = f.acquire(1 << 20);
        EXPECT_EQ(f.offset(s), static_cast<uint64_t>(i) << 20);
    }
    EXPECT_FALSE(f.has_free(1));  // full
    EXPECT_TRUE(f.release(0));
    EXPECT_TRUE(f.has_free(1 << 20));
    EXPECT_FALSE(f.has_free((1 << 20) + 1));
    EXPECT_EQ(f.next_offset(1 << 20), 0u);  // wraps into the space given back
    EXPECT_FALSE(f.has_free(5 << 20));      // never more than the arena
}

TEST(SlotFifo, RandomUseNeverOverlapsALiveAllocation) {
    std::mt19937_64 rng(3);
    constexpr uint64_t kArena = 1000;
    SlotFifo f(8, kArena);
    struct Live {
        int slot;
        uint64_t off, len;
    };
    std::deque<Live> live;
    for (int step = 0; step < 200000; ++step) {
        if (!live.empty() && (rng() % 3 == 0 || !f.has_free(1))) {
            ASSERT_TRUE(f.release(live.front().slot));
            live.pop_front();
            continue;
        }
        const uint64_t len = 1 + rng() % 400;
        if (!f.has_free(len)) continue;
        const uint64_t at = f.next_offset(len);
        const int s = f.acquire(len);
        ASSERT_EQ(f.offset(s), at);
        ASSERT_EQ(f.length(s), len);
        ASSERT_LE(at + len, kArena);
        for (const Live& l : live) {
            ASSERT_TRUE(at + len <= l.off || l.off + l.len <= at)
                << "[" << at << ", +" << len << ") overlaps [" << l.off << ", +" << l.len << ")";
        }
        live.push_back(Live{s, at, len});
        ASSERT_LE(live.size(), 8u);
    }
}

}  // namespace
}  // namespace tcpx
