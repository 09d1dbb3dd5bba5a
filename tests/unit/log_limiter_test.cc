#include "net/plugin/log_limiter.h"

#include <gtest/gtest.h>

#include "common/params.h"
#include "net/v7_common.h"
#include "tests/support/log_capture.h"

namespace tcpx::net {
namespace {

struct FakeClock {
    int64_t now = 1000;
    LogRateLimiter::Clock clock() {
        return [this] { return now; };
    }
};

TEST(LogRateLimiter, BurstPerSourceThenCountsTheRest) {
    FakeClock t;
    LogRateLimiter limiter(3, 1000, t.clock());
    for (int i = 0; i < 3; ++i) {
        auto v = limiter.admit("net_tcpx.cc", 42);
        EXPECT_TRUE(v.print) << i;
        EXPECT_EQ(v.suppressed, 0u);
    }
    for (int i = 0; i < 7; ++i) EXPECT_FALSE(limiter.admit("net_tcpx.cc", 42).print) << i;
    // Another line of the same file, or the same line number of another file, has its own burst.
    EXPECT_TRUE(limiter.admit("net_tcpx.cc", 43).print);
    EXPECT_TRUE(limiter.admit("connect.cc", 42).print);
    // Still inside the interval.
    t.now += 999;
    auto v = limiter.admit("net_tcpx.cc", 42);
    EXPECT_FALSE(v.print);
    EXPECT_EQ(v.suppressed, 0u);
    // The interval is over: the first line of the next one prints, carrying the count (7 + 1).
    t.now += 1;
    v = limiter.admit("net_tcpx.cc", 42);
    EXPECT_TRUE(v.print);
    EXPECT_EQ(v.suppressed, 8u);
    // Counted once only.
    v = limiter.admit("net_tcpx.cc", 42);
    EXPECT_TRUE(v.print);
    EXPECT_EQ(v.suppressed, 0u);
    EXPECT_TRUE(limiter.admit("net_tcpx.cc", 42).print);
    EXPECT_FALSE(limiter.admit("net_tcpx.cc", 42).print);
}

TEST(LogRateLimiter, ZeroBurstPrintsOnlyCounts) {
    FakeClock t;
    LogRateLimiter limiter(0, 500, t.clock());
    for (int i = 0; i < 4; ++i) EXPECT_FALSE(limiter.admit("a.cc", 1).print);
    t.now += 10000;
    auto v = limiter.admit("a.cc", 1);
    EXPECT_FALSE(v.print);
    EXPECT_EQ(v.suppressed, 4u);
}

TEST(LogRateLimiter, ConfigureForgetsState) {
    FakeClock t;
    LogRateLimiter limiter(1, 1000, t.clock());
    EXPECT_TRUE(limiter.admit("a.cc", 1).print);
    EXPECT_FALSE(limiter.admit("a.cc", 1).print);
    limiter.configure(2, 1000);
    EXPECT_EQ(limiter.interval_ms(), 1000);
    auto v = limiter.admit("a.cc", 1);
    EXPECT_TRUE(v.print);
    EXPECT_EQ(v.suppressed, 0u);
    EXPECT_TRUE(limiter.admit("a.cc", 1).print);
    EXPECT_FALSE(limiter.admit("a.cc", 1).print);
}

TEST(LogRateLimiter, SourcesAreBounded) {
    FakeClock t;
    LogRateLimiter limiter(1, 1000, t.clock());
    // Far more distinct sources than any plugin has: beyond the bound they share one budget.
    int printed = 0;
    for (int i = 0; i < 10000; ++i) printed += limiter.admit("x.cc", i).print ? 1 : 0;
    EXPECT_LT(printed, 10000);
    EXPECT_GE(printed, 1000);
}

TEST(LogRateLimiter, ThePluginLoggerApplies) {
    testing::LogCapture capture(LogLevel::kWarn);
    plugin_log_limiter().configure(2, 86400000);
    tcpx_ncclDebugLogger_t logger = nccl_logger_into_tcpx_log();
    for (int i = 0; i < 10; ++i) {
        logger(TCPX_NCCL_LOG_WARN, TCPX_NCCL_NET_FLAG, "plugin.cc", 7, "flood %d", i);
    }
    logger(TCPX_NCCL_LOG_WARN, TCPX_NCCL_NET_FLAG, "plugin.cc", 8, "elsewhere");
    // Below the level printed: not counted against the burst either.
    logger(TCPX_NCCL_LOG_INFO, TCPX_NCCL_NET_FLAG, "plugin.cc", 9, "quiet");
    EXPECT_EQ(capture.count("flood"), 2) << capture.all();
    EXPECT_TRUE(capture.contains("flood 0"));
    EXPECT_TRUE(capture.contains("flood 1"));
    EXPECT_TRUE(capture.contains("elsewhere"));
    EXPECT_FALSE(capture.contains("quiet"));
    const Settings defaults;
    plugin_log_limiter().configure(defaults.plugin_log_burst, defaults.plugin_log_interval_ms);
}

}  // namespace
}  // namespace tcpx::net
