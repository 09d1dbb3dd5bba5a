// The chunk packer (engine/packer.h): every byte of every piece is in exactly one chunk, in
// order; chunks respect the size and piece limits; large pieces go alone; count() agrees with
// next() from any cursor.
#include "engine/packer.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace tcpx::engine::packer {
namespace {

struct Walk {
    std::vector<Cut> cuts;
    std::vector<Cursor> before;  // the cursor before each cut
    Cursor end;                  // after the last
};

Walk walk(const std::vector<uint64_t>& lens, uint64_t chunk) {
    const auto len_at = [&](size_t i) { return lens[i]; };
    Walk w;
    Cursor at;
    Cut c;
    for (;;) {
        const Cursor was = at;
        if (!next(len_at, lens.size(), chunk, &at, &c)) break;
        w.before.push_back(was);
        w.cuts.push_back(c);
        w.end = at;
    }
    return w;
}

// Checks the cuts against the rule and returns them flattened to (piece, offset, len) runs.
void check(const std::vector<uint64_t>& lens, uint64_t chunk) {
    const auto len_at = [&](size_t i) { return lens[i]; };
    const Walk w = walk(lens, chunk);
    ASSERT_EQ(count(len_at, lens.size(), chunk), w.cuts.size());
    size_t piece = 0;
    uint64_t offset = 0;
    for (size_t k = 0; k < w.cuts.size(); ++k) {
        SCOPED_TRACE("chunk " + std::to_string(k));
        const Cut& c = w.cuts[k];
        // Where the last chunk left off (zero-length pieces skipped).
        while (piece < lens.size() && lens[piece] == 0) ++piece;
        ASSERT_EQ(c.first, piece);
        ASSERT_EQ(c.offset, offset);
        ASSERT_GT(c.len, 0u);
        ASSERT_LE(c.len, chunk);
        ASSERT_GE(c.pieces, 1u);
        ASSERT_LE(c.pieces, kMaxChunkPieces);
        ASSERT_LT(c.first, c.end);
        if (lens[c.first] >= chunk) {
            // A large piece: alone, chunk-sized but the last.
            ASSERT_EQ(c.pieces, 1u);
            ASSERT_LE(c.offset + c.len, lens[c.first]);
            if (c.offset + c.len < lens[c.first]) {
                ASSERT_EQ(c.len, chunk);
            }
            offset = c.offset + c.len;
            if (offset == lens[c.first]) {
                piece = c.first + 1;
                offset = 0;
            } else {
                piece = c.first;
            }
        } else {
            // Small pieces, whole; the next non-empty piece would not have fitted.
            ASSERT_EQ(c.offset, 0u);
            uint64_t sum = 0;
            uint32_t n = 0;
            for (size_t i = c.first; i < c.end; ++i) {
                ASSERT_LT(lens[i], chunk);
                sum += lens[i];
                n += lens[i] > 0 ? 1 : 0;
            }
            ASSERT_EQ(sum, c.len);
            ASSERT_EQ(n, c.pieces);
            size_t after = c.end;
            while (after < lens.size() && lens[after] == 0) ++after;
            if (after < lens.size()) {
                ASSERT_TRUE(lens[after] >= chunk || sum + lens[after] > chunk ||
                            n == kMaxChunkPieces);
            }
            piece = c.end;
            offset = 0;
        }
        // Counting from this chunk's cursor on gives the chunks left.
        ASSERT_EQ(count(len_at, lens.size(), chunk, w.before[k]), w.cuts.size() - k);
    }
    while (piece < lens.size() && lens[piece] == 0) ++piece;
    EXPECT_EQ(piece, lens.size());
    // The last cut leaves the cursor at the end, past any empty pieces: a caller that keeps a
    // list while its cursor is not at the end (refill) lets it go with its last chunk.
    if (!w.cuts.empty()) {
        EXPECT_EQ(w.end.piece, lens.size());
    }
}

// A large piece's last chunk, then empty pieces: the cursor ends past them (it stopped on the
// first, and refill() kept the transfer's entry after the transfer had gone).
TEST(Packer, EmptyPiecesAfterALargeOneEndTheList) {
    check({4096, 0}, 4096);
    check({8192, 0, 0}, 4096);
    check({100, 4096, 0}, 4096);
    check({0, 5000, 0, 0, 0}, 4096);
}

TEST(Packer, NothingToCut) {
    check({}, 4096);
    check({0, 0, 0}, 4096);
    EXPECT_EQ(walk({0, 0}, 4096).cuts.size(), 0u);
}

TEST(Packer, SmallPiecesShareChunks) {
    // 16 KiB blocks, 64 KiB chunks: four per chunk.
    std::vector<uint64_t> lens(10, 16384);
    const Walk w = walk(lens, 65536);
    ASSERT_EQ(w.cuts.size(), 3u);
    EXPECT_EQ(w.cuts[0].pieces, 4u);
    EXPECT_EQ(w.cuts[2].pieces, 2u);
    EXPECT_EQ(w.cuts[2].len, 32768u);
    check(lens, 65536);
}

TEST(Packer, LargePiecesGoAloneAndAreCutByTheChunk) {
    const std::vector<uint64_t> lens{100, 10 * 4096 + 5, 7, 4096, 3};
    const Walk w = walk(lens, 4096);
    // 100 | 10 full + 5 | 7 | 4096 | 3
    ASSERT_EQ(w.cuts.size(), 1u + 11u + 1u + 1u + 1u);
    EXPECT_EQ(w.cuts[11].len, 5u);
    EXPECT_EQ(w.cuts[11].offset, 10u * 4096);
    check(lens, 4096);
}

TEST(Packer, AChunkHoldsAtMostTheLimitOfPieces) {
    std::vector<uint64_t> lens(3000, 1);
    const Walk w = walk(lens, 1 << 20);
    ASSERT_EQ(w.cuts.size(), 3u);
    EXPECT_EQ(w.cuts[0].pieces, kMaxChunkPieces);
    check(lens, 1 << 20);
}

TEST(Packer, RandomListsFollowTheRule) {
    std::mt19937_64 rng(42);
    for (int round = 0; round < 400; ++round) {
        SCOPED_TRACE("round " + std::to_string(round));
        const uint64_t chunk = 4096u << (rng() % 6);
        std::vector<uint64_t> lens(rng() % 300);
        for (uint64_t& len : lens) {
            switch (rng() % 5) {
                case 0:
                    len = 0;
                    break;
                case 1:
                    len = 1 + rng() % 64;
                    break;
                case 2:
                    len = 1 + rng() % chunk;
                    break;
                case 3:
                    len = chunk - 1 + rng() % 3;
                    break;
                default:
                    len = 1 + rng() % (4 * chunk);
                    break;
            }
        }
        check(lens, chunk);
    }
}

TEST(Packer, TransferChunkPipelinesShortGpuTransfersOnly) {
    constexpr uint64_t kAgreed = 4 << 20;
    EXPECT_EQ(transfer_chunk(kAgreed, 1 << 20, false), kAgreed);
    EXPECT_EQ(transfer_chunk(kAgreed, 1 << 20, true), 256u * 1024);
    EXPECT_EQ(transfer_chunk(kAgreed, 4 << 20, true), 1u << 20);
    EXPECT_EQ(transfer_chunk(kAgreed, 16 << 20, true), kAgreed);
    EXPECT_EQ(transfer_chunk(kAgreed, 64 << 20, true), kAgreed);
    EXPECT_EQ(transfer_chunk(kAgreed, 100000, true), 128u * 1024);   // never below 128 KiB
    EXPECT_EQ(transfer_chunk(64 * 1024, 200000, true), 64u * 1024);  // never above the agreed
    EXPECT_EQ(transfer_chunk(kAgreed, (1 << 20) + 1, true) % 4096, 0u);
}

}  // namespace
}  // namespace tcpx::engine::packer
