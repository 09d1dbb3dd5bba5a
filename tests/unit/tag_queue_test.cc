// Matching by tag for two-sided transfers (src/engine/tag_queue.h).
#include "engine/tag_queue.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <random>

namespace tcpx::engine {
namespace {

TEST(TagQueue, OldestFirstWithinATagWhateverTheOthersDo) {
    TagQueue<int> q;
    EXPECT_TRUE(q.empty());
    EXPECT_FALSE(q.take(5).has_value());
    q.push(5, 1);
    q.push(9, 2);
    q.push(5, 3);
    q.push(0, 4);
    q.push(~uint64_t{0}, 5);
    EXPECT_EQ(q.size(), 5u);
    EXPECT_EQ(q.take(5), 1);
    EXPECT_EQ(q.take(5), 3);
    EXPECT_FALSE(q.take(5).has_value());
    EXPECT_FALSE(q.take(6).has_value());  // (between 5 and 9: not the next tag's item)
    EXPECT_EQ(q.take(~uint64_t{0}), 5);
    EXPECT_EQ(q.take(0), 4);
    EXPECT_EQ(q.take(9), 2);
    EXPECT_TRUE(q.empty());
}

TEST(TagQueue, AnItemErasedByItsKeyIsGoneAndOnlyIt) {
    TagQueue<int> q;
    const auto a = q.push(7, 1);
    const auto b = q.push(7, 2);
    const auto c = q.push(7, 3);
    EXPECT_TRUE(q.erase(b));
    EXPECT_FALSE(q.erase(b));  // once
    EXPECT_EQ(q.take(7), 1);
    EXPECT_FALSE(q.erase(a));           // taken already
    EXPECT_FALSE(q.erase({8, c.seq}));  // the right place under another tag is not it
    EXPECT_TRUE(q.erase(c));
    EXPECT_TRUE(q.empty());
    // Keys are not given twice, even after everything went.
    const auto d = q.push(7, 4);
    EXPECT_NE(d.seq, a.seq);
    EXPECT_NE(d.seq, c.seq);
}

TEST(TagQueue, TakeIfTakesWhatItPicksAndKeepsTheOrderOfTheRest) {
    TagQueue<int> q;
    for (int i = 0; i < 20; ++i) q.push(static_cast<uint64_t>(i % 3), i);
    std::vector<int> odd = q.take_if([](int v) { return v % 2 == 1; });
    EXPECT_EQ(odd.size(), 10u);
    for (int v : odd) EXPECT_EQ(v % 2, 1);
    EXPECT_EQ(q.size(), 10u);
    for (uint64_t tag = 0; tag < 3; ++tag) {
        int last = -1;
        while (auto v = q.take(tag)) {
            EXPECT_EQ(*v % 2, 0);
            EXPECT_EQ(static_cast<uint64_t>(*v % 3), tag);
            EXPECT_GT(*v, last);
            last = *v;
        }
    }
    EXPECT_TRUE(q.empty());
    q.push(1, 1);
    q.clear();
    EXPECT_TRUE(q.empty());
    EXPECT_FALSE(q.take(1).has_value());
}

// Against a model (a FIFO per tag), over random pushes, takes and erases with tags from a
// narrow range (many per tag) and a wide one.
TEST(TagQueue, MatchesAFifoPerTag) {
    for (uint64_t tags : {uint64_t{4}, uint64_t{1} << 40}) {
        std::mt19937_64 rng(tags);
        TagQueue<uint64_t> q;
        std::map<uint64_t, std::deque<std::pair<TagQueue<uint64_t>::Key, uint64_t>>> model;
        size_t held = 0;
        for (uint64_t i = 0; i < 20000; ++i) {
            const uint64_t tag = rng() % tags;
            const int op = static_cast<int>(rng() % 3);
            if (op == 0 || held == 0) {
                model[tag].emplace_back(q.push(tag, i), i);
                ++held;
            } else if (op == 1) {
                auto got = q.take(tag);
                auto& fifo = model[tag];
                if (fifo.empty()) {
                    ASSERT_FALSE(got.has_value()) << "op " << i;
                } else {
                    ASSERT_EQ(got, fifo.front().second) << "op " << i;
                    fifo.pop_front();
                    --held;
                }
            } else {
                // Erase a random held item by its key (the first tag at or after `tag`).
                auto it = model.lower_bound(tag);
                while (it != model.end() && it->second.empty()) ++it;
                if (it == model.end()) continue;
                auto& fifo = it->second;
                const size_t k = rng() % fifo.size();
                ASSERT_TRUE(q.erase(fifo[k].first)) << "op " << i;
                fifo.erase(fifo.begin() + static_cast<std::ptrdiff_t>(k));
                --held;
            }
            ASSERT_EQ(q.size(), held);
        }
    }
}

}  // namespace
}  // namespace tcpx::engine
