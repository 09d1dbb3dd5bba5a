// Registration windows (engine/reg_windows.h): every chunk lies inside the window find() names,
// windows respect the transport's limit and the page rule, and impossible shapes are refused.
// Exhaustive over tiny shapes (limits of a few pages), random chunks over real ones.
#include "engine/reg_windows.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace tcpx::engine {
namespace {

constexpr uint64_t kPage = RegWindows::kPage;
constexpr uintptr_t kBase = uintptr_t{1} << 40;  // an address with room on both sides

struct Shape {
    uintptr_t base;
    uint64_t len;
    uint64_t max_reg;
    uint64_t max_chunk;
    bool page_cover;
    std::string str() const {
        return "base +" + std::to_string(base - kBase) + " len " + std::to_string(len) +
               " max_reg " + std::to_string(max_reg) + " chunk " + std::to_string(max_chunk) +
               (page_cover ? " cover" : "");
    }
};

// What is registered: the region, or its page cover.
void cover_of(const Shape& s, uintptr_t* lo, uintptr_t* hi) {
    *lo = s.base;
    *hi = s.base + s.len;
    if (s.page_cover) {
        *lo &= ~uintptr_t{kPage - 1};
        *hi = (*hi + kPage - 1) & ~uintptr_t{kPage - 1};
    }
}

// The windows themselves: within the cover, within the limit, whole pages apart, every byte
// of the cover in some window, no window beyond the one that reaches the end.
void check_windows(const Shape& s, const RegWindows& w) {
    uintptr_t lo, hi;
    cover_of(s, &lo, &hi);
    ASSERT_GE(w.count(), 1u);
    if (s.max_reg == 0 || hi - lo <= s.max_reg) {
        ASSERT_EQ(w.count(), 1u);
        EXPECT_EQ(w.window(0).base, lo);
        EXPECT_EQ(w.window(0).len, hi - lo);
        return;
    }
    EXPECT_LE(w.width(), s.max_reg);
    EXPECT_EQ(w.width() % kPage, 0u);
    EXPECT_EQ(w.stride() % kPage, 0u);
    EXPECT_GE(w.stride(), kPage);
    EXPECT_LE(w.stride() + s.max_chunk, w.width());
    uintptr_t reached = lo;
    for (size_t k = 0; k < w.count(); ++k) {
        const RegWindows::Window win = w.window(k);
        ASSERT_GE(win.base, lo);
        ASSERT_GT(win.len, 0u);
        ASSERT_LE(win.len, s.max_reg);
        ASSERT_LE(win.base + win.len, hi);
        ASSERT_EQ((win.base - lo) % kPage, 0u);
        if (s.page_cover) {
            ASSERT_EQ(win.base % kPage, 0u);
        }
        ASSERT_LE(win.base, reached) << "a gap before window " << k;
        reached = std::max(reached, win.base + win.len);
        // Only the last window reaches the end.
        ASSERT_EQ(win.base + win.len == hi, k + 1 == w.count()) << "window " << k;
    }
    ASSERT_EQ(reached, hi);
}

// Whether find() names a window holding all of [ptr, ptr + n); no gtest macro, as the exhaustive
// test asks millions of times.
bool holds(const RegWindows& w, uintptr_t ptr, uint64_t n, size_t* index) {
    auto k = w.find(ptr, n);
    if (!k.ok() || *k >= w.count()) return false;
    const RegWindows::Window win = w.window(*k);
    *index = *k;
    return ptr >= win.base && ptr + n <= win.base + win.len;
}

void check_chunk(const Shape& s, const RegWindows& w, uintptr_t ptr, uint64_t n) {
    size_t k = 0;
    ASSERT_TRUE(holds(w, ptr, n, &k)) << s.str() << " ptr +" << ptr - s.base << " n " << n;
}

TEST(RegWindows, OneWindowWhenTheRegionFits) {
    for (bool cover : {false, true}) {
        auto w = RegWindows::make(kBase + 5, 3 * kPage, 0, 64 << 20, cover);
        ASSERT_TRUE(w.ok());
        ASSERT_EQ(w->count(), 1u);
        EXPECT_EQ(w->window(0).base, cover ? kBase : kBase + 5);
        EXPECT_EQ(w->window(0).len, cover ? 4 * kPage : 3 * kPage);
        // Exactly at the limit: still one window, even with chunks the limit could not split.
        w = RegWindows::make(kBase, 3 * kPage, 3 * kPage, 3 * kPage, cover);
        ASSERT_TRUE(w.ok());
        EXPECT_EQ(w->count(), 1u);
        EXPECT_EQ(*w->find(kBase + 1, 3 * kPage - 1), 0u);
    }
    // Host memory is registered as itself, not by its pages.
    auto w = RegWindows::make(kBase + 1, 10, 4 * kPage, 10, false);
    ASSERT_TRUE(w.ok());
    EXPECT_EQ(w->window(0).base, kBase + 1);
    EXPECT_EQ(w->window(0).len, 10u);
}

TEST(RegWindows, ExhaustiveOverTinyShapes) {
    const uint64_t limits[] = {2 * kPage, 3 * kPage + 100, 5 * kPage - 1};
    const uintptr_t offsets[] = {0, 1, kPage + 17};
    int shapes = 0;
    for (uint64_t max_reg : limits) {
        const uint64_t half = (max_reg & ~(kPage - 1)) / 2;
        for (uint64_t chunk : {uint64_t{1}, kPage - 1, kPage, kPage + 1, half}) {
            if (chunk > half) continue;
            for (uintptr_t off : offsets) {
                for (bool cover : {false, true}) {
                    for (uint64_t len : {uint64_t{1}, kPage - 1, max_reg - 1, max_reg, max_reg + 1,
                                         3 * max_reg + 7}) {
                        const Shape s{kBase + off, len, max_reg, chunk, cover};
                        SCOPED_TRACE(s.str());
                        auto w = RegWindows::make(s.base, s.len, s.max_reg, s.max_chunk, cover);
                        ASSERT_TRUE(w.ok()) << w.status().to_string();
                        check_windows(s, *w);
                        // Every start, with the largest chunk that fits there and with 1 byte;
                        // and every length at the region's end. Every window is the answer for
                        // some chunk: none is registered for nothing.
                        std::vector<bool> used(w->count());
                        for (uint64_t p = 0; p < len; ++p) {
                            size_t k = 0;
                            if (!holds(*w, s.base + p, std::min(chunk, len - p), &k)) {
                                check_chunk(s, *w, s.base + p, std::min(chunk, len - p));
                                return;
                            }
                            if (!holds(*w, s.base + p, 1, &k)) {
                                check_chunk(s, *w, s.base + p, 1);
                                return;
                            }
                            used[k] = true;
                        }
                        for (uint64_t n = 1; n <= std::min(chunk, len); ++n) {
                            size_t k = 0;
                            if (!holds(*w, s.base + len - n, n, &k)) {
                                check_chunk(s, *w, s.base + len - n, n);
                                return;
                            }
                        }
                        EXPECT_EQ(std::count(used.begin(), used.end(), false), 0);
                        ++shapes;
                    }
                }
            }
        }
    }
    EXPECT_GT(shapes, 250);
}

TEST(RegWindows, RandomChunksOverRealShapes) {
    std::mt19937_64 rng(7);
    const uint64_t v7_limit = (uint64_t{1} << 31) - kPage;
    const uint64_t GiB = uint64_t{1} << 30;
    for (uint64_t len : {3 * GiB, 6 * GiB + 12345, 100 * GiB + 1}) {
        for (uint64_t chunk : {uint64_t{512} << 10, uint64_t{4} << 20, uint64_t{64} << 20}) {
            for (bool cover : {false, true}) {
                const Shape s{kBase + 4096 * 3 + (cover ? 1000 : 0), len, v7_limit, chunk, cover};
                SCOPED_TRACE(s.str());
                auto w = RegWindows::make(s.base, s.len, s.max_reg, s.max_chunk, cover);
                ASSERT_TRUE(w.ok()) << w.status().to_string();
                check_windows(s, *w);
                // As few windows as the stride allows.
                uintptr_t lo, hi;
                cover_of(s, &lo, &hi);
                EXPECT_EQ(w->count(), 1 + (hi - lo - w->width() + w->stride() - 1) / w->stride());
                for (int i = 0; i < 20000; ++i) {
                    const uint64_t n = 1 + rng() % chunk;
                    uint64_t p = rng() % (len - n + 1);
                    if (i % 4 == 1) {  // around a window's end
                        const uint64_t k = rng() % w->count();
                        const uint64_t edge = w->window(k).base + w->window(k).len - s.base;
                        p = std::min(len - n, edge - std::min(edge, rng() % (2 * chunk)));
                    } else if (i % 4 == 2) {  // at the region's end
                        p = len - n - std::min(len - n, rng() % 3);
                    }
                    check_chunk(s, *w, s.base + p, n);
                }
            }
        }
    }
}

TEST(RegWindows, V7LimitWithDefaultChunksNeedsFewWindows) {
    const uint64_t GiB = uint64_t{1} << 30;
    auto w = RegWindows::make(kBase, 3 * GiB, (uint64_t{1} << 31) - kPage, 64 << 20, true);
    ASSERT_TRUE(w.ok());
    EXPECT_EQ(w->count(), 2u);
    w = RegWindows::make(kBase, 6 * GiB, (uint64_t{1} << 31) - kPage, 64 << 20, true);
    ASSERT_TRUE(w.ok());
    EXPECT_EQ(w->count(), 4u);
}

TEST(RegWindows, RefusesImpossibleShapes) {
    // A chunk over half a window.
    auto w = RegWindows::make(kBase, 10 * kPage, 4 * kPage, 2 * kPage + 1, false);
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(w.status().message().find("XFER_CHUNK_SIZE"), std::string::npos)
        << w.status().to_string();
    // The limit rounds down to whole pages first: 4 pages - 1 byte is 3 pages of window.
    EXPECT_FALSE(RegWindows::make(kBase, 10 * kPage, 4 * kPage - 1, 2 * kPage, false).ok());
    EXPECT_TRUE(RegWindows::make(kBase, 10 * kPage, 4 * kPage - 1, kPage, false).ok());
    // A limit under two pages leaves no stride.
    EXPECT_FALSE(RegWindows::make(kBase, 10 * kPage, 2 * kPage - 1, 1, false).ok());
    EXPECT_FALSE(RegWindows::make(kBase, 10 * kPage, 100, 1, false).ok());
    // Degenerate arguments.
    EXPECT_FALSE(RegWindows::make(kBase, 0, 0, 1, false).ok());
    EXPECT_FALSE(RegWindows::make(kBase, 10, 0, 0, false).ok());
    EXPECT_FALSE(RegWindows::make(UINTPTR_MAX - 5, 10, 0, 1, false).ok());
    EXPECT_FALSE(RegWindows::make(UINTPTR_MAX - 20, 10, 0, 1, true).ok());
}

TEST(RegWindows, RefusesChunksOutsideTheRegionOrTooLarge) {
    for (uint64_t max_reg : {uint64_t{0}, 4 * kPage}) {
        auto w = RegWindows::make(kBase + 10, 10 * kPage, max_reg, kPage, true);
        ASSERT_TRUE(w.ok());
        EXPECT_FALSE(w->find(kBase + 10, 0).ok());
        EXPECT_FALSE(w->find(kBase + 10, kPage + 1).ok());
        EXPECT_FALSE(w->find(kBase + 9, 1).ok());  // before, though inside the page cover
        EXPECT_FALSE(w->find(kBase + 10 + 10 * kPage - 1, 2).ok());
        EXPECT_FALSE(w->find(kBase + 10 + 10 * kPage, 1).ok());
        EXPECT_FALSE(w->find(UINTPTR_MAX, 1).ok());
        EXPECT_TRUE(w->find(kBase + 10 + 10 * kPage - 1, 1).ok());
    }
}

}  // namespace
}  // namespace tcpx::engine
