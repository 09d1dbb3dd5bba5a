// common/cache_lines.h: writing lines back leaves every byte as it was, whatever the range's
// alignment, and counts what it wrote back.
#include "common/cache_lines.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tests/support/net_test_util.h"

namespace tcpx::testing {
namespace {

TEST(CacheLines, WritingBackKeepsEveryByteAndCountsIt) {
    std::vector<uint8_t> buf(1 << 20);
    fill_pattern(buf.data(), buf.size(), 3);
    const std::vector<uint8_t> copy = buf;
    const uint64_t before = bytes_written_back();
    uint64_t asked = 0;
    for (const auto& [off, len] : std::vector<std::pair<size_t, size_t>>{
             {0, 0}, {0, 1}, {63, 2}, {1, 4095}, {4096, 64}, {100, 1 << 19}, {0, 1 << 20}}) {
        write_back_lines(buf.data() + off, len);
        asked += len;
    }
    EXPECT_EQ(buf, copy);
    EXPECT_EQ(bytes_written_back() - before, asked);
}

}  // namespace
}  // namespace tcpx::testing
