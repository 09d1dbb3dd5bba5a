// Wakeup (common/wakeup.h): the fd turns readable only for a notify() that finds it armed, drain()
// resets it, and a sleeper that arms, looks, then sleeps never misses work finished meanwhile.
#include "common/wakeup.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <thread>

namespace tcpx {
namespace {

bool readable(const Wakeup& w, int timeout_ms = 0) {
    pollfd p{w.fd(), POLLIN, 0};
    return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN) != 0;
}

TEST(Wakeup, OnlyAnArmedWakeupSignals) {
    auto w = Wakeup::create();
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    Wakeup& wake = **w;
    wake.notify();  // nobody sleeps: no system call, nothing readable
    EXPECT_FALSE(readable(wake));
    EXPECT_EQ(wake.signals(), 0u);
    wake.arm();
    wake.notify();
    EXPECT_TRUE(readable(wake));
    EXPECT_EQ(wake.signals(), 1u);
    wake.notify();  // disarmed by the first: no second write
    EXPECT_EQ(wake.signals(), 1u);
    wake.drain();
    EXPECT_FALSE(readable(wake));
    // drain() leaves an arm() in place: the fd it drained may have been written for an older one.
    wake.arm();
    wake.drain();
    wake.notify();
    EXPECT_TRUE(readable(wake));
    EXPECT_EQ(wake.signals(), 2u);
}

// A finisher publishes work items one by one; the sleeper arms, looks, and sleeps only if it
// found nothing new. A lost wakeup leaves it asleep with work published: it would sleep out the
// full poll timeout, which the test counts (with 10 s per sleep, a real loss cannot hide in
// scheduling noise).
TEST(Wakeup, NoWakeupIsLostBetweenTheLookAndTheSleep) {
    auto w = Wakeup::create();
    ASSERT_TRUE(w.ok());
    Wakeup& wake = **w;
    constexpr uint64_t kItems = 20000;
    std::atomic<uint64_t> published{0};
    std::thread finisher([&] {
        for (uint64_t i = 1; i <= kItems; ++i) {
            published.store(i, std::memory_order_release);
            wake.notify();
            if (i % 64 == 0) std::this_thread::yield();
        }
    });
    uint64_t seen = 0;
    int overslept = 0;
    while (seen < kItems) {
        const uint64_t now = published.load(std::memory_order_acquire);
        if (now != seen) {
            seen = now;
            continue;
        }
        wake.arm();
        if (published.load(std::memory_order_acquire) != seen) continue;  // the look
        if (!readable(wake, 10000)) {
            ++overslept;
            break;  // lost: one is enough, and each costs 10 s
        }
        wake.drain();
    }
    finisher.join();
    EXPECT_EQ(overslept, 0);
    EXPECT_LE(wake.signals(), kItems);
}

}  // namespace
}  // namespace tcpx
