#include "common/strings.h"

#include <gtest/gtest.h>

namespace tcpx {
namespace {

TEST(Strings, Format) {
    EXPECT_EQ(strformat("%d-%s", 5, "x"), "5-x");
    EXPECT_EQ(strformat("%s", ""), "");
    const std::string long_text(5000, 'a');
    EXPECT_EQ(strformat("%s!", long_text.c_str()), long_text + "!");
}

TEST(Strings, FormatBytes) {
    EXPECT_EQ(format_bytes(0), "0 B");
    EXPECT_EQ(format_bytes(1023), "1023 B");
    EXPECT_EQ(format_bytes(1024), "1 KiB");
    EXPECT_EQ(format_bytes(1536), "1.5 KiB");
    EXPECT_EQ(format_bytes(64ULL << 20), "64 MiB");
    EXPECT_EQ(format_bytes(1ULL << 30), "1 GiB");
}

TEST(Strings, SplitAndTrim) {
    EXPECT_EQ(split_trimmed(" a, b ,,c ", ','), (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_TRUE(split_trimmed("", ',').empty());
    EXPECT_EQ(trim("  x y \n"), "x y");
    EXPECT_EQ(trim("   "), "");
}

TEST(Strings, Hex) {
    const uint8_t bytes[] = {0x00, 0x7f, 0xff, 0x10};
    EXPECT_EQ(to_hex(bytes, 4), "007fff10");
    std::vector<uint8_t> out;
    ASSERT_TRUE(from_hex("007FfF10", &out));
    EXPECT_EQ(out, std::vector<uint8_t>(bytes, bytes + 4));
    EXPECT_FALSE(from_hex("abc", &out));
    EXPECT_FALSE(from_hex("zz", &out));
}

TEST(Strings, PrintableKeepsPrintableAsciiOnly) {
    EXPECT_EQ(printable("peer 'b': ok ~"), "peer 'b': ok ~");
    EXPECT_EQ(printable(std::string("a\0b\n\x7f\x80\xff\x1b[2J", 11)), "a?b?????[2J");
    EXPECT_EQ(printable(""), "");
}

}  // namespace
}  // namespace tcpx
