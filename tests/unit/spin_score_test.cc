// The score behind the progress thread's and wait()'s spins (src/engine/spin_score.h).
#include "engine/spin_score.h"

#include <gtest/gtest.h>

#include <cstdint>

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

// QuietSpin on plain numbers for times (microseconds), spinning through the first 100 of a spell.
using Quiet = QuietSpin<int64_t, int64_t>;

TEST(QuietSpin, SpinsOnlyThroughTheFirstPartOfASpellAndOnlyWhenEnabled) {
    Quiet off(false, 100);
    off.quiet(0);
    EXPECT_FALSE(off.spin(10));
    Quiet q(true, 100);
    EXPECT_FALSE(q.spin(0));  // no spell yet
    q.quiet(1000);
    EXPECT_TRUE(q.spin(1000));
    EXPECT_TRUE(q.spin(1099));
    EXPECT_FALSE(q.spin(1100));
    // A pass finding nothing again later (a timed wakeup) does not start the spell over.
    q.quiet(1500);
    EXPECT_FALSE(q.spin(1510));
    // Work ends it; the next spell spins again.
    q.moved(1600);
    EXPECT_FALSE(q.spin(1601));
    q.quiet(1700);
    EXPECT_TRUE(q.spin(1750));
}

TEST(QuietSpin, SomethingInFlightEndsTheSpellUnscored) {
    Quiet q(true, 100);
    q.quiet(0);
    q.busy();
    EXPECT_FALSE(q.spin(10));
    // Busy spells are not quiet ones: however long, they do not turn the quiet spin off.
    for (int64_t t = 0; t < 100 * 1000; t += 1000) {
        q.busy();
        q.moved(t + 999);
    }
    q.quiet(200000);
    EXPECT_TRUE(q.spin(200010));
}

TEST(QuietSpin, LongSpellsTurnItOffAndShortOnesBackOn) {
    Quiet q(true, 100);
    int64_t t = 0;
    int longs = 0;
    // Requests 5 ms apart: a spin would never catch the next one.
    for (;;) {
        q.quiet(t);
        if (!q.spin(t + 1)) break;
        q.moved(t + 5000);
        t += 5001;
        ASSERT_LE(++longs, SpinScore::kHistory) << "long spells never turned the spin off";
    }
    EXPECT_GE(longs, 2);  // not on the first long spell
    // Requests back to back again, slept through meanwhile: still scored, so it comes back.
    int shorts = 0;
    for (;;) {
        q.moved(t + 20);
        t += 21;
        q.quiet(t);
        if (q.spin(t + 1)) break;
        ASSERT_LE(++shorts, SpinScore::kHistory) << "short spells never turned the spin back on";
    }
}

}  // namespace
}  // namespace tcpx::engine
