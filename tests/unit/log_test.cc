#include "common/log.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "tests/support/log_capture.h"

namespace tcpx {
namespace {

TEST(Log, LevelsFilterAndSinkReceives) {
    testing::LogCapture capture(LogLevel::kWarn);
    TCPX_INFO("hidden %d", 1);
    TCPX_WARN("shown %d", 2);
    TCPX_ERROR("also %s", "shown");
    EXPECT_FALSE(capture.contains("hidden"));
    EXPECT_TRUE(capture.contains("warn shown 2"));
    EXPECT_TRUE(capture.contains("error also shown"));
}

TEST(Log, OffSilencesEverything) {
    testing::LogCapture capture(LogLevel::kOff);
    TCPX_ERROR("nothing");
    EXPECT_FALSE(capture.contains("nothing"));
}

TEST(Log, LongMessagesAreKeptWhole) {
    testing::LogCapture capture(LogLevel::kInfo);
    const std::string text(3000, 'x');
    TCPX_INFO("%s|end", text.c_str());
    EXPECT_TRUE(capture.contains(text + "|end"));
}

TEST(Log, ParseLevelNames) {
    LogLevel level;
    ASSERT_TRUE(parse_log_level("TRACE", &level));
    EXPECT_EQ(level, LogLevel::kTrace);
    ASSERT_TRUE(parse_log_level("warn", &level));
    EXPECT_EQ(level, LogLevel::kWarn);
    EXPECT_FALSE(parse_log_level("verbose", &level));
}

TEST(Log, ConcurrentLoggingIsSafe) {
    testing::LogCapture capture(LogLevel::kInfo);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([t] {
            for (int i = 0; i < 200; ++i) TCPX_INFO("thread %d line %d", t, i);
        });
    }
    for (auto& th : threads) th.join();
    EXPECT_TRUE(capture.contains("thread 3 line 199"));
}

}  // namespace
}  // namespace tcpx
