// Registrations larger than a transport registers at once: 3 GiB host registrations on both
// sides, over the emulated TCPX plugin (a v7 table, whose regMr takes an int size, so the engine
// registers windows) and over the socket transport (no limit). WRITE and READ of ranges that
// straddle window boundaries and the region's ends, every byte verified, and the bytes around each
// range checked untouched. The emulated plugin refuses a request whose memory handle's
// registration does not hold the buffer, so a wrong window fails the transfer.
//
// Memory comes from anonymous MAP_NORESERVE mappings: only the pages a test fills, moves or
// checks are ever backed. Skipped under ThreadSanitizer, whose shadow of multi-GiB mappings does
// not fit CI machines. TCPX_TEST_BIG=1 also runs a 6 GiB registration moved and checked whole
// (12 GiB of memory in use).
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/engine_test_util.h"

#if defined(__SANITIZE_THREAD__)
#define TCPX_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TCPX_TEST_TSAN 1
#endif
#endif

namespace tcpx::testing {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kPage = 4096;
// What the engine registers at most through a v7 table: whole pages below 2 GiB.
constexpr uint64_t kV7Window = (uint64_t{1} << 31) - kPage;
constexpr uint64_t kChunk = 1 << 20;
// Checked around every range.
constexpr uint64_t kGuard = 3 * kPage + 5;

enum class Transport { kSocket, kFakeTcpx };

std::string transport_name(const ::testing::TestParamInfo<Transport>& info) {
    return info.param == Transport::kSocket ? "SocketNet" : "FakeTcpx";
}

// An anonymous mapping whose pages are backed only once touched.
class Mapping {
 public:
    explicit Mapping(uint64_t len) : len_(len) {
        void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p != MAP_FAILED) data_ = static_cast<uint8_t*>(p);
    }
    ~Mapping() {
        if (data_ != nullptr) ::munmap(data_, len_);
    }
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    uint8_t* data() { return data_; }
    uint64_t size() const { return len_; }

 private:
    uint8_t* data_ = nullptr;
    uint64_t len_;
};

// The pattern's byte at absolute offset `off` of a buffer: depends on where it is, so a byte
// landing at the wrong place (another window's address) is caught.
inline uint64_t pattern_word(uint64_t word_index, uint64_t seed) {
    uint64_t z = word_index + seed * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
inline uint8_t pattern_byte(uint64_t off, uint64_t seed) {
    return static_cast<uint8_t>(pattern_word(off / 8, seed) >> (8 * (off % 8)));
}

void fill(uint8_t* base, uint64_t off, uint64_t len, uint64_t seed) {
    uint64_t o = off;
    for (; o < off + len && o % 8 != 0; ++o) base[o] = pattern_byte(o, seed);
    for (; o + 8 <= off + len; o += 8) {
        const uint64_t w = pattern_word(o / 8, seed);
        std::memcpy(base + o, &w, 8);  // little-endian: byte k of the word is offset o + k
    }
    for (; o < off + len; ++o) base[o] = pattern_byte(o, seed);
}

// The first offset in [off, off + len) where `base` differs from what the pattern of `seed`
// written at `src_off` would put there; -1 if none.
int64_t mismatch(const uint8_t* base, uint64_t off, uint64_t len, uint64_t src_off, uint64_t seed) {
    for (uint64_t i = 0; i < len; ++i) {
        if (base[off + i] != pattern_byte(src_off + i, seed)) return static_cast<int64_t>(off + i);
    }
    return -1;
}

// Fast whole-buffer check for aligned offsets (the big test).
int64_t mismatch_words(const uint8_t* base, uint64_t len, uint64_t seed) {
    for (uint64_t o = 0; o + 8 <= len; o += 8) {
        uint64_t w;
        std::memcpy(&w, base + o, 8);
        if (w != pattern_word(o / 8, seed)) return static_cast<int64_t>(o);
    }
    return mismatch(base, len & ~uint64_t{7}, len % 8, len & ~uint64_t{7}, seed);
}

class EngineBigReg : public ::testing::TestWithParam<Transport> {
 protected:
    void SetUp() override {
#if defined(TCPX_TEST_TSAN)
        GTEST_SKIP() << "multi-GiB registrations: ThreadSanitizer's shadow memory does not fit";
#endif
        ::setenv("FAKETCPX_MEMORY", "host", 1);
        config_ = engine_test_config();
        config_.xfer_chunk_size = kChunk;
        config_.peer_timeout_ms = 60000;
        if (GetParam() == Transport::kFakeTcpx) config_.net_plugin = TCPX_FAKE_TCPX_PATH;
        a_ = make_endpoint("alpha", config_);
        b_ = make_endpoint("beta", config_);
        ASSERT_TRUE(a_ && b_);
        link_ = link(a_.get(), b_.get());
        ASSERT_NE(link_.a_to_b, 0u);
    }

    void TearDown() override {
        a_.reset();
        b_.reset();
    }

    struct Side {
        std::unique_ptr<Mapping> map;
        MemId mem = 0;
        RemoteMem desc;
    };
    void make_side(Endpoint* ep, uint64_t len, Side* s) {
        s->map = std::make_unique<Mapping>(len);
        ASSERT_NE(s->map->data(), nullptr) << "mmap of " << len << " bytes failed";
        auto mem = ep->reg(s->map->data(), len);
        ASSERT_TRUE(mem.ok()) << mem.status().to_string();
        s->mem = *mem;
        s->desc = *ep->describe(s->mem);
    }

    Status write(Side& from, uint64_t off, Side& to, uint64_t roff, uint64_t len) {
        auto x = a_->write(link_.a_to_b, from.mem, off, to.desc, roff, len);
        if (!x.ok()) return x.status();
        return a_->wait(*x, 600s);
    }
    Status read(Side& into, uint64_t off, Side& from, uint64_t roff, uint64_t len) {
        auto x = a_->read(link_.a_to_b, into.mem, off, from.desc, roff, len);
        if (!x.ok()) return x.status();
        return a_->wait(*x, 600s);
    }

    // Moves [off, off + len) of `from` to `roff` of `to` (a WRITE when a holds `from`, else a
    // READ) and checks the range and the guard bytes around it in `to`.
    void move_and_check(bool write_op, Side& from, uint64_t off, Side& to, uint64_t roff,
                        uint64_t len, uint64_t seed) {
        SCOPED_TRACE(std::string(write_op ? "WRITE" : "READ") + " from " + std::to_string(off) +
                     " to " + std::to_string(roff) + " len " + std::to_string(len));
        const uint64_t size = to.map->size();
        const uint64_t lo = roff - std::min(roff, kGuard);
        const uint64_t hi = std::min(size, roff + len + kGuard);
        // Guards (and the target range) hold a pattern of their own first.
        fill(to.map->data(), lo, hi - lo, seed + 1000);
        fill(from.map->data(), off, len, seed);
        Status st = write_op ? write(from, off, to, roff, len) : read(to, roff, from, off, len);
        ASSERT_TRUE(st.ok()) << st.to_string();
        EXPECT_EQ(mismatch(to.map->data(), roff, len, off, seed), -1);
        EXPECT_EQ(mismatch(to.map->data(), lo, roff - lo, lo, seed + 1000), -1);
        EXPECT_EQ(mismatch(to.map->data(), roff + len, hi - roff - len, roff + len, seed + 1000),
                  -1);
    }

    Config config_;
    std::unique_ptr<Endpoint> a_, b_;
    Link link_;
};

TEST_P(EngineBigReg, ThreeGiBRangesAcrossWindowsAndEnds) {
    const uint64_t size = 3 * kGiB;
    Side a, b;
    make_side(a_.get(), size, &a);
    make_side(b_.get(), size, &b);
    if (HasFatalFailure()) return;
    // Through v7: windows [0, W) and [S, S + W) cut at the end (S = W - chunk).
    const uint64_t w = kV7Window;
    const uint64_t s = kV7Window - kChunk;
    struct Range {
        uint64_t off, roff, len;
    };
    std::vector<Range> ranges = {
        {0, 0, 3 * kChunk + 7},                                             // the start
        {size - 3 * kChunk - 11, size - 3 * kChunk - 11, 3 * kChunk + 11},  // the end
        {size - 1, size - 1, 1},                                            // the last byte
        {s - kChunk / 2 - 3, s - kChunk / 2 - 3, 3 * kChunk},         // across window 1's start
        {w - kChunk / 2 + 1, w - kChunk / 2 + 1, 2 * kChunk},         // across window 0's end
        {(uint64_t{1} << 31) - 100, (uint64_t{1} << 31) - 100, 200},  // across 2 GiB
        {s - 5, w - 5, kChunk + 10},                                  // different windows each side
        {size - kChunk - 1, 100, kChunk + 1},                         // the end to the start
        {123, size - 2 * kChunk, 2 * kChunk},                         // the start to the end
    };
    if (GetParam() == Transport::kSocket) ranges.resize(4);  // no windows: a few suffice
    uint64_t seed = 1;
    for (const Range& r : ranges) {
        move_and_check(true, a, r.off, b, r.roff, r.len, ++seed);
        move_and_check(false, b, r.roff, a, r.off, r.len, ++seed);
        if (HasFatalFailure()) return;
    }
    EXPECT_TRUE(a_->dereg(a.mem).ok());
    EXPECT_TRUE(b_->dereg(b.mem).ok());
}

// Moves a whole registration each way, every byte checked. 12 GiB of memory.
TEST_P(EngineBigReg, SixGiBMovedWhole) {
    const char* big = std::getenv("TCPX_TEST_BIG");
    if (big == nullptr || std::strcmp(big, "1") != 0) {
        GTEST_SKIP() << "moves 2 x 6 GiB and needs 12 GiB of memory: set TCPX_TEST_BIG=1";
    }
    const uint64_t size = 6 * kGiB + 3 * kPage + 123;
    Side a, b;
    make_side(a_.get(), size, &a);
    make_side(b_.get(), size, &b);
    if (HasFatalFailure()) return;
    using SteadyClock = std::chrono::steady_clock;
    auto secs = [](SteadyClock::time_point t0) {
        return std::chrono::duration<double>(SteadyClock::now() - t0).count();
    };
    auto t0 = SteadyClock::now();
    fill(a.map->data(), 0, size, 11);
    std::printf("fill 6 GiB: %.1f s\n", secs(t0));
    t0 = SteadyClock::now();
    Status st = write(a, 0, b, 0, size);
    ASSERT_TRUE(st.ok()) << st.to_string();
    std::printf("WRITE 6 GiB: %.1f s\n", secs(t0));
    t0 = SteadyClock::now();
    ASSERT_EQ(mismatch_words(b.map->data(), size, 11), -1);
    std::printf("check 6 GiB: %.1f s\n", secs(t0));
    fill(b.map->data(), 0, size, 12);
    t0 = SteadyClock::now();
    st = read(a, 0, b, 0, size);
    ASSERT_TRUE(st.ok()) << st.to_string();
    std::printf("READ 6 GiB: %.1f s\n", secs(t0));
    ASSERT_EQ(mismatch_words(a.map->data(), size, 12), -1);
    std::fflush(stdout);
}

INSTANTIATE_TEST_SUITE_P(Transports, EngineBigReg,
                         ::testing::Values(Transport::kSocket, Transport::kFakeTcpx),
                         transport_name);

}  // namespace
}  // namespace tcpx::testing
