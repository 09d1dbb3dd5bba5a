// The score behind the progress thread's and wait()'s spins (src/engine/spin_score.h).
#include "engine/spin_score.h"

#include <gtest/gtest.h>

namespace tcpx::engine {
namespace {

constexpr int kHistory = SpinScore::kHistory;

TEST(SpinScore, PaysAtFirstAndAfterShortWaits) {
    SpinScore s;
    EXPECT_TRUE(s.pays());
    for (int i = 0; i < 100; ++i) s.record(true);
    EXPECT_TRUE(s.pays());
}

TEST(SpinScore, OneLongStallAmongShortWaitsLeavesItOn) {
    SpinScore s;
    for (int i = 0; i < 10; ++i) {
        s.record(false);  // a loaded machine's stall
        EXPECT_TRUE(s.pays()) << "round " << i;
        for (int k = 0; k < kHistory; ++k) s.record(true);
    }
}

TEST(SpinScore, RunsOfLongWaitsTurnItOffAndShortOnesBackOn) {
    SpinScore s;
    int longs = 0;
    while (s.pays()) {
        s.record(false);
        ASSERT_LE(++longs, kHistory) << "a slow wire's waits never turned the spin off";
    }
    EXPECT_GE(longs, 2);  // not on the first long wait
    for (int i = 0; i < 1000; ++i) s.record(false);
    EXPECT_FALSE(s.pays());
    int shorts = 0;
    while (!s.pays()) {
        s.record(true);
        ASSERT_LE(++shorts, kHistory) << "a fast wire's waits never turned the spin back on";
    }
}

}  // namespace
}  // namespace tcpx::engine
