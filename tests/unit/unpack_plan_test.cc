// The plan of an unpack straight into a chunk's pieces (cuda/unpack_plan.h): run on the CPU, it
// must leave every piece exactly as the unpack into one buffer and the scatter out of it would,
// never write outside the pieces, and report what the unpack kernel reports as bad.
#include "cuda/unpack_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/device.h"
#include "cuda/unpack.h"
#include "tests/support/host_device.h"
#include "tests/support/sanitizers.h"

namespace tcpx::cuda {
namespace {

constexpr uint8_t kGuard = 0xa5;
constexpr size_t kGuardBytes = 64;

// Pieces of the given lengths, each with guard bytes on both sides, in one arena.
struct Pieces {
    explicit Pieces(const std::vector<uint64_t>& lens) {
        size_t at = kGuardBytes;
        for (uint64_t len : lens) {
            offsets.push_back(at);
            at += len + kGuardBytes;
        }
        arena.assign(at, kGuard);
        for (size_t i = 0; i < lens.size(); ++i) {
            segs.push_back(Seg{arena.data() + offsets[i], lens[i], 0});
        }
    }
    uint64_t total() const {
        uint64_t t = 0;
        for (const Seg& s : segs) t += s.len;
        return t;
    }
    // The chunk as the pieces hold it, back to back.
    std::vector<uint8_t> joined() const {
        std::vector<uint8_t> out;
        for (const Seg& s : segs) out.insert(out.end(), s.ptr, s.ptr + s.len);
        return out;
    }
    bool guards_intact() const {
        size_t at = 0;
        for (size_t i = 0; i <= segs.size(); ++i) {
            const size_t end = i < segs.size() ? offsets[i] : arena.size();
            for (size_t k = at; k < end; ++k) {
                if (arena[k] != kGuard) return false;
            }
            if (i < segs.size()) at = offsets[i] + segs[i].len;
        }
        return true;
    }
    std::vector<size_t> offsets;
    std::vector<uint8_t> arena;
    std::vector<Seg> segs;
};

// A devmem-style receive of `total` bytes: pages of at most 4 KiB (some shorter) at shuffled
// places of a bounce buffer, listed in a shuffled order.
struct Receive {
    Receive(uint64_t total, std::mt19937_64& rng) {
        uint64_t at = 0;
        while (at < total) {
            const uint32_t len =
                static_cast<uint32_t>(std::min<uint64_t>(total - at, 1 + rng() % kUnpackPageSize));
            entries.push_back(LoadMeta{0, len, at});
            at += len;
        }
        std::vector<uint32_t> pages(entries.size());
        std::iota(pages.begin(), pages.end(), 0u);
        std::shuffle(pages.begin(), pages.end(), rng);
        bounce.resize(pages.size() * kUnpackPageSize);
        for (auto& b : bounce) b = static_cast<uint8_t>(rng());
        for (size_t i = 0; i < entries.size(); ++i) {
            entries[i].src_off = pages[i] * kUnpackPageSize +
                                 static_cast<uint32_t>(rng() % 7) * (entries[i].len < 4000 ? 1 : 0);
        }
        std::shuffle(entries.begin(), entries.end(), rng);
    }
    std::vector<LoadMeta> entries;
    std::vector<uint8_t> bounce;
};

UnpackPlan plan_and_run(const std::vector<LoadMeta>& entries, uint64_t count,
                        const std::vector<uint8_t>& bounce, Pieces& p, size_t capacity = 8192) {
    std::vector<CopyEntry> list(capacity);
    std::vector<uint64_t> starts;
    UnpackPlan plan = plan_unpack_scatter(entries.data(), count, bounce.data(), p.segs, list.data(),
                                          list.size(), &starts);
    if (!plan.fits) return plan;
    // Every copy stays inside one piece and is at most a tile.
    for (size_t i = 0; i < plan.count; ++i) {
        const CopyEntry& e = list[i];
        EXPECT_LE(e.len, kCopyTile);
        EXPECT_GT(e.len, 0u);
        bool inside = false;
        for (const Seg& s : p.segs) {
            const uint64_t lo = reinterpret_cast<uint64_t>(s.ptr);
            if (e.dst >= lo && e.dst + e.len <= lo + s.len) inside = true;
        }
        EXPECT_TRUE(inside) << "copy " << i << " leaves its piece";
    }
    run_copy_entries(list.data(), plan.count);
    return plan;
}

TEST(UnpackPlan, PiecesGetWhatTheUnpackAndScatterWouldGive) {
    std::mt19937_64 rng(7);
    // 300 rounds; 60 under a sanitizer (24 s under TSan with 300).
    const int rounds = testing::unless_sanitized(300, 60);
    for (int round = 0; round < rounds; ++round) {
        std::vector<uint64_t> lens(1 + rng() % 64);
        for (auto& l : lens) {
            const int kind = static_cast<int>(rng() % 4);
            l = kind == 0   ? 0
                : kind == 1 ? 1 + rng() % 64
                : kind == 2 ? 1 + rng() % 8192
                            : 1 + rng() % 70000;
        }
        Pieces p(lens);
        Receive r(p.total(), rng);
        const UnpackPlan plan = plan_and_run(r.entries, r.entries.size(), r.bounce, p);
        ASSERT_TRUE(plan.fits);
        EXPECT_FALSE(plan.bad);
        std::vector<uint8_t> want(p.total(), 0);
        ASSERT_TRUE(unpack_reference(r.entries.data(), r.entries.size(), r.bounce.data(),
                                     want.data(), want.size()));
        ASSERT_EQ(p.joined(), want) << "round " << round;
        ASSERT_TRUE(p.guards_intact()) << "round " << round;
    }
}

TEST(UnpackPlan, EntriesOutsideTheChunkAreSkippedAndReported) {
    std::mt19937_64 rng(11);
    Pieces p({100, 0, 5000, 3});
    Receive r(p.total(), rng);
    std::vector<LoadMeta> bad = r.entries;
    const uint64_t total = p.total();
    bad.push_back(LoadMeta{0, 16, total - 8});        // straddles the end
    bad.push_back(LoadMeta{0, 1, total});             // just past it
    bad.push_back(LoadMeta{0, 0xffffffffu, 0});       // longer than the chunk
    bad.push_back(LoadMeta{0, 8, ~uint64_t{0} - 4});  // offset + length overflows
    std::shuffle(bad.begin(), bad.end(), rng);
    const UnpackPlan plan = plan_and_run(bad, bad.size(), r.bounce, p);
    ASSERT_TRUE(plan.fits);
    EXPECT_TRUE(plan.bad);
    EXPECT_TRUE(p.guards_intact());
    // The good entries still landed.
    std::vector<uint8_t> want(total, 0);
    unpack_reference(r.entries.data(), r.entries.size(), r.bounce.data(), want.data(), total);
    EXPECT_EQ(p.joined(), want);
}

TEST(UnpackPlan, ACountAboveASlotIsBadAndOnlyASlotIsRead) {
    std::mt19937_64 rng(3);
    Pieces p({kUnpackMaxEntries + 10u});
    std::vector<LoadMeta> entries(kUnpackMaxEntries + 10);
    std::vector<uint8_t> bounce(entries.size(), 0x42);
    for (size_t i = 0; i < entries.size(); ++i) {
        entries[i] = LoadMeta{static_cast<uint32_t>(i), 1, i};
    }
    const UnpackPlan plan = plan_and_run(entries, entries.size(), bounce, p);
    EXPECT_TRUE(plan.bad);
    EXPECT_EQ(plan.count, static_cast<size_t>(kUnpackMaxEntries));
    EXPECT_TRUE(p.guards_intact());
}

TEST(UnpackPlan, AListLongerThanTheCapacityIsNotUsable) {
    std::mt19937_64 rng(5);
    Pieces p(std::vector<uint64_t>(300, 10));  // every 4 KiB page crosses many pieces
    Receive r(p.total(), rng);
    std::vector<CopyEntry> list(64);
    std::vector<uint64_t> starts;
    const UnpackPlan plan = plan_unpack_scatter(r.entries.data(), r.entries.size(), r.bounce.data(),
                                                p.segs, list.data(), list.size(), &starts);
    EXPECT_FALSE(plan.fits);
    EXPECT_LE(plan.count, list.size());
}

TEST(UnpackPlan, NoPiecesTakeNothing) {
    std::vector<Seg> none;
    std::vector<CopyEntry> list(4);
    std::vector<uint64_t> starts;
    std::vector<uint8_t> bounce(16);
    const LoadMeta entries[] = {{0, 0, 0}, {0, 4, 0}};
    const UnpackPlan plan =
        plan_unpack_scatter(entries, 2, bounce.data(), none, list.data(), list.size(), &starts);
    EXPECT_TRUE(plan.fits);
    EXPECT_TRUE(plan.bad);  // the second reaches past an empty chunk
    EXPECT_EQ(plan.count, 0u);
}

// The engine posts a devmem receive that unpacks straight into its pieces on a record of the
// ring alone (acquire(0)): such receives, many more than the ring's buffer holds, each land
// right. One whose pieces the ring cannot take straight (another GPU's) is refused rather than
// unpacked into a buffer allocation it does not have.
TEST(UnpackScatter, StraightIntoPiecesNeedsARecordNotTheBuffer) {
    testing::HostDevice dev(2);
    constexpr size_t kSlotBytes = 64 * 1024;
    // Two slots' worth of buffer, eight records.
    auto made = dev.make_ring(0, kSlotBytes, 2, 8);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    CopyRing& ring = **made;
    std::mt19937_64 rng(17);
    struct Posted {
        std::unique_ptr<Pieces> pieces;
        Receive receive;
        int slot;
    };
    std::vector<Posted> posted;
    for (int k = 0; k < 6; ++k) {
        auto p = std::make_unique<Pieces>(std::vector<uint64_t>{3000, 20000, 1, 41000});
        for (Seg& s : p->segs) s.device = 0;
        dev.declare(p->arena.data(), p->arena.size(), 0);
        Receive r(p->total(), rng);
        ASSERT_TRUE(ring.unpacks_into(p->segs));
        ASSERT_TRUE(ring.has_free(0)) << "receive " << k;
        const int slot = ring.acquire(0);
        ASSERT_LE(ring.length(slot), 1u);  // no chunk bytes of the buffer held
        Status st =
            ring.unpack_scatter(slot, r.entries.data(), r.entries.size(), r.bounce.data(), p->segs);
        ASSERT_TRUE(st.ok()) << st.to_string();
        posted.push_back(Posted{std::move(p), std::move(r), slot});
    }
    EXPECT_EQ(ring.in_use(), 6);  // more than the buffer's two slots at once
    EXPECT_EQ(dev.direct_unpacks(), 6u);
    for (Posted& q : posted) {
        bool done = false;
        for (int polls = 0; !done && polls < 4; ++polls) {
            auto ready = ring.ready(q.slot);
            ASSERT_TRUE(ready.ok()) << ready.status().to_string();
            done = *ready;
        }
        ASSERT_TRUE(done);
        std::vector<uint8_t> want(q.pieces->total(), 0);
        ASSERT_TRUE(unpack_reference(q.receive.entries.data(), q.receive.entries.size(),
                                     q.receive.bounce.data(), want.data(), want.size()));
        EXPECT_EQ(q.pieces->joined(), want);
        EXPECT_TRUE(q.pieces->guards_intact());
        ASSERT_TRUE(ring.release(q.slot));
    }

    // Entries overlapping many times over (no real receive's): more copies than a list holds,
    // and no room to go through the twin: refused, nothing written.
    {
        Pieces p(std::vector<uint64_t>(64, kSlotBytes / 64));
        for (Seg& s : p.segs) s.device = 0;
        dev.declare(p.arena.data(), p.arena.size(), 0);
        const std::vector<uint8_t> before = p.arena;
        std::vector<uint8_t> bounce(kSlotBytes, 0x5a);
        std::vector<LoadMeta> entries(kUnpackMaxEntries,
                                      LoadMeta{0, static_cast<uint32_t>(kSlotBytes), 0});
        const int slot = ring.acquire(0);
        Status st =
            ring.unpack_scatter(slot, entries.data(), entries.size(), bounce.data(), p.segs);
        EXPECT_EQ(st.code(), StatusCode::kProtocol) << st.to_string();
        ring.synchronize();
        EXPECT_EQ(p.arena, before);
        ASSERT_TRUE(ring.release(slot));
        dev.forget(p.arena.data());
    }

    // Pieces on the other GPU: not taken straight, and the record has no allocation to unpack
    // into first: an error, and nothing written.
    Pieces other({5000, 7000});
    for (Seg& s : other.segs) s.device = 1;
    dev.declare(other.arena.data(), other.arena.size(), 1);
    const std::vector<uint8_t> before = other.arena;
    Receive r(other.total(), rng);
    EXPECT_FALSE(ring.unpacks_into(other.segs));
    const int slot = ring.acquire(0);
    Status st =
        ring.unpack_scatter(slot, r.entries.data(), r.entries.size(), r.bounce.data(), other.segs);
    EXPECT_FALSE(st.ok());
    ring.synchronize();
    EXPECT_EQ(other.arena, before);
    EXPECT_EQ(dev.direct_unpacks(), 6u);
    for (Posted& q : posted) dev.forget(q.pieces->arena.data());
    dev.forget(other.arena.data());
}

}  // namespace
}  // namespace tcpx::cuda
