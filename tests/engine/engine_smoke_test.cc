#include <gtest/gtest.h>

#include <cstring>

#include "tests/support/engine_test_util.h"
#include "tests/support/net_test_util.h"

namespace tcpx::testing {
namespace {

TEST(EngineSmoke, WriteReadNotify) {
    auto a = make_endpoint("a");
    auto b = make_endpoint("b");
    ASSERT_TRUE(a && b);
    Link l = link(a.get(), b.get());
    ASSERT_NE(l.a_to_b, 0u);
    EXPECT_EQ(*a->peer_name(l.a_to_b), "b");
    EXPECT_EQ(*b->peer_name(l.b_to_a), "a");
    for (size_t size : {size_t{100}, size_t{5} << 20}) {
        GuardedBuffer src(size), dst(size), back(size);
        fill_pattern(src.data(), size, size);
        MemId ms = *a->reg(src.data(), size);
        MemId mb = *a->reg(back.data(), size);
        MemId md = *b->reg(dst.data(), size);
        RemoteMem rd = *b->describe(md);
        auto w = a->write(l.a_to_b, ms, 0, rd, 0, size, std::string_view("hello"));
        ASSERT_TRUE(w.ok()) << w.status().to_string();
        ASSERT_TRUE(a->wait(*w, std::chrono::seconds(10)).ok());
        EXPECT_EQ(find_pattern_mismatch(dst.data(), size, size), -1);
        auto n = b->get_notifications();
        ASSERT_EQ(n.size(), 1u);
        EXPECT_EQ(n[0].peer, "a");
        EXPECT_EQ(n[0].payload, "hello");
        auto r = a->read(l.a_to_b, mb, 0, rd, 0, size);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        Status st = a->wait(*r, std::chrono::seconds(10));
        ASSERT_TRUE(st.ok()) << st.to_string();
        EXPECT_EQ(find_pattern_mismatch(back.data(), size, size), -1);
        EXPECT_TRUE(src.canaries_intact() && dst.canaries_intact() && back.canaries_intact());
        ASSERT_TRUE(a->dereg(ms).ok());
        ASSERT_TRUE(a->dereg(mb).ok());
        ASSERT_TRUE(b->dereg(md).ok());
    }
}

}  // namespace
}  // namespace tcpx::testing
