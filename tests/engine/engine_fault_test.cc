// The engine over a transport that fails on purpose (TCPX_P2P_FAULT, docs/fault-injection.md):
// two endpoints in one process, one of them configured with a rule. Whatever the fault, every
// transfer ends (done or failed) within a bound, nothing is written outside the transfer's range
// of the registration (nor around it), and where a fault hits one peer only the others go on.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "tests/support/engine_test_util.h"
#include "tests/support/net_test_util.h"

namespace tcpx::testing {
namespace {

using namespace std::chrono_literals;

// How long any transfer may take before the test calls it a hang: PEER_TIMEOUT_MS is 2 s here.
constexpr auto kBound = 20s;
constexpr uint64_t kRegion = 6 << 20;
constexpr uint64_t kOffset = (1 << 20) + 123;  // the transfer's range in both registrations
constexpr uint64_t kLen = (4 << 20) + 4567;    // 17 chunks of 256 KiB over 2 channels

enum class Direction { kWrite, kRead };
enum class Outcome {
    kSucceeds,  // OK, every byte in place
    kFails,     // an error (never wait() running out: that is a hang)
    kEnds,      // either; when OK, only the rule's flipped bytes differ (corrupt)
};

struct Case {
    const char* name;
    Direction dir;
    const char* initiator_fault;
    const char* target_fault;
    Outcome outcome;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

Config fault_config(const std::string& fault) {
    Config c = engine_test_config();
    c.peer_timeout_ms = 2000;
    c.fault = fault;
    return c;
}

// An endpoint pair; the initiator `a` writes to or reads from the target `b`.
struct Pair {
    // Buffers first: they must outlive the endpoints, which may still be moving their bytes
    // for a peer that failed until they are destroyed.
    std::unique_ptr<GuardedBuffer> abuf, bbuf;
    std::unique_ptr<Endpoint> a, b;
    Link link;
    MemId amem = 0, bmem = 0;
    RemoteMem bdesc;

    bool open(const Config& ca, const Config& cb) {
        a = make_endpoint("initiator", ca);
        b = make_endpoint("target", cb);
        if (!a || !b) return false;
        link = tcpx::testing::link(a.get(), b.get());
        abuf = std::make_unique<GuardedBuffer>(kRegion, 0x11);
        bbuf = std::make_unique<GuardedBuffer>(kRegion, 0x22);
        auto am = a->reg(abuf->data(), kRegion);
        auto bm = b->reg(bbuf->data(), kRegion);
        if (!am.ok() || !bm.ok()) return false;
        amem = *am;
        bmem = *bm;
        auto d = b->describe(bmem);
        if (!d.ok()) return false;
        bdesc = *d;
        return link.a_to_b != 0 && link.b_to_a != 0;
    }
};

// Runs one transfer of the pattern `seed` and waits for its end.
Status transfer(Pair& p, Endpoint* via, PeerId peer, MemId mem, const RemoteMem& remote,
                Direction dir) {
    auto x = dir == Direction::kWrite ? via->write(peer, mem, kOffset, remote, kOffset, kLen)
                                      : via->read(peer, mem, kOffset, remote, kOffset, kLen);
    if (!x.ok()) return x.status();
    (void)p;
    return via->wait(*x, kBound);
}

// Bytes of `data` outside [kOffset, kOffset + kLen) that are not `fill`.
size_t changed_outside(const uint8_t* data, uint8_t fill) {
    size_t n = 0;
    for (uint64_t i = 0; i < kRegion; ++i) {
        if ((i < kOffset || i >= kOffset + kLen) && data[i] != fill) ++n;
    }
    return n;
}

size_t pattern_mismatches(const uint8_t* data, uint64_t seed) {
    std::vector<uint8_t> expect(kLen);
    fill_pattern(expect.data(), kLen, seed);
    size_t n = 0;
    for (uint64_t i = 0; i < kLen; ++i) n += data[kOffset + i] != expect[i];
    return n;
}

class EngineFaultTest : public ::testing::TestWithParam<Case> {};

TEST_P(EngineFaultTest, TransferEndsAndStaysInsideTheRegistration) {
    const Case& c = GetParam();
    Pair p;
    ASSERT_TRUE(p.open(fault_config(c.initiator_fault), fault_config(c.target_fault)));
    constexpr uint64_t kSeed = 4242;
    uint8_t* src = c.dir == Direction::kWrite ? p.abuf->data() : p.bbuf->data();
    uint8_t* dst = c.dir == Direction::kWrite ? p.bbuf->data() : p.abuf->data();
    const uint8_t dst_fill = c.dir == Direction::kWrite ? 0x22 : 0x11;
    fill_pattern(src + kOffset, kLen, kSeed);

    const Status st = transfer(p, p.a.get(), p.link.a_to_b, p.amem, p.bdesc, c.dir);
    // wait() timing out (not the engine failing the transfer with TIMEOUT) means it never ended.
    ASSERT_EQ(st.message().find("still in flight"), std::string::npos)
        << "the transfer did not end within the bound: " << st.to_string();
    switch (c.outcome) {
        case Outcome::kSucceeds:
            ASSERT_TRUE(st.ok()) << st.to_string();
            EXPECT_EQ(pattern_mismatches(dst, kSeed), 0u);
            break;
        case Outcome::kFails:
            EXPECT_FALSE(st.ok()) << "the fault went unnoticed";
            break;
        case Outcome::kEnds:
            if (st.ok()) {
                EXPECT_LE(pattern_mismatches(dst, kSeed), 1u);
            }
            break;
    }
    EXPECT_EQ(changed_outside(dst, dst_fill), 0u);
    EXPECT_TRUE(p.abuf->canaries_intact());
    EXPECT_TRUE(p.bbuf->canaries_intact());
    if (!st.ok()) {
        // The failure is the peer's: transfers to it fail at once from then on, never hang.
        const Status again = transfer(p, p.a.get(), p.link.a_to_b, p.amem, p.bdesc, c.dir);
        EXPECT_EQ(again.message().find("still in flight"), std::string::npos) << again.to_string();
    }
}

const Case kCases[] = {
    // WRITE: the initiator sends the chunks, the target receives them.
    {"WriteFailedSend", Direction::kWrite, "fail:isend:3", "", Outcome::kFails},
    {"WriteResetSend", Direction::kWrite, "reset:isend:3", "", Outcome::kFails},
    {"WriteDroppedSend", Direction::kWrite, "drop:isend:3", "", Outcome::kFails},
    {"WriteDelayedSend", Direction::kWrite, "delay:isend:3:300ms", "", Outcome::kSucceeds},
    {"WriteDelayedCompletion", Direction::kWrite, "delay:test:2:200ms", "", Outcome::kSucceeds},
    {"WriteTruncatedSend", Direction::kWrite, "truncate:isend:3", "", Outcome::kFails},
    {"WriteFailedCompletion", Direction::kWrite, "fail:test:5", "", Outcome::kFails},
    {"WriteFailedRegistration", Direction::kWrite, "fail:reg_mr:1", "", Outcome::kFails},
    {"WriteTargetFailedReceive", Direction::kWrite, "", "fail:irecv:3", Outcome::kFails},
    {"WriteTargetResetReceive", Direction::kWrite, "", "reset:irecv:3", Outcome::kFails},
    {"WriteTargetDroppedReceive", Direction::kWrite, "", "drop:irecv:3", Outcome::kFails},
    {"WriteTargetDelayedReceive", Direction::kWrite, "", "delay:irecv:3:300ms", Outcome::kSucceeds},
    {"WriteTargetTruncatedReceive", Direction::kWrite, "", "truncate:irecv:3", Outcome::kFails},
    {"WriteTargetCorruptReceive", Direction::kWrite, "", "corrupt:irecv:3", Outcome::kEnds},
    {"WriteTargetFailedConsume", Direction::kWrite, "", "fail:irecv_consumed:2", Outcome::kFails},
    // READ: the target sends the chunks, the initiator receives them.
    {"ReadFailedReceive", Direction::kRead, "fail:irecv:3", "", Outcome::kFails},
    {"ReadResetReceive", Direction::kRead, "reset:irecv:3", "", Outcome::kFails},
    {"ReadDroppedReceive", Direction::kRead, "drop:irecv:3", "", Outcome::kFails},
    {"ReadDelayedReceive", Direction::kRead, "delay:irecv:3:300ms", "", Outcome::kSucceeds},
    {"ReadTruncatedReceive", Direction::kRead, "truncate:irecv:3", "", Outcome::kFails},
    {"ReadCorruptReceive", Direction::kRead, "corrupt:irecv:3", "", Outcome::kEnds},
    {"ReadFailedCompletion", Direction::kRead, "fail:test:4", "", Outcome::kFails},
    {"ReadTargetFailedSend", Direction::kRead, "", "fail:isend:3", Outcome::kFails},
    {"ReadTargetResetSend", Direction::kRead, "", "reset:isend:3", Outcome::kFails},
    {"ReadTargetDroppedSend", Direction::kRead, "", "drop:isend:3", Outcome::kFails},
    {"ReadTargetDelayedSend", Direction::kRead, "", "delay:isend:3:300ms", Outcome::kSucceeds},
    {"ReadTargetTruncatedSend", Direction::kRead, "", "truncate:isend:3", Outcome::kFails},
};

INSTANTIATE_TEST_SUITE_P(Kinds, EngineFaultTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& param) {
                             return std::string(param.param.name);
                         });

// A fault on one peer's data channels: that peer fails, a second peer of the same endpoint keeps
// working, data verified.
void second_peer_keeps_working(const std::string& fault) {
    // The first peer's comms are the endpoint's comms 1 to 4 (2 channels, each way).
    Pair p;
    ASSERT_TRUE(p.open(fault_config(fault), fault_config("")));
    GuardedBuffer cbuf(kRegion, 0x33);
    auto c = make_endpoint("bystander", fault_config(""));
    ASSERT_NE(c, nullptr);
    const Link ac = link(p.a.get(), c.get());
    ASSERT_NE(ac.a_to_b, 0u);
    auto cmem = c->reg(cbuf.data(), kRegion);
    ASSERT_TRUE(cmem.ok());
    auto cdesc = c->describe(*cmem);
    ASSERT_TRUE(cdesc.ok());

    fill_pattern(p.abuf->data() + kOffset, kLen, 1);
    const Status st = transfer(p, p.a.get(), p.link.a_to_b, p.amem, p.bdesc, Direction::kWrite);
    ASSERT_EQ(st.message().find("still in flight"), std::string::npos)
        << "the transfer did not end within the bound: " << st.to_string();
    EXPECT_FALSE(st.ok());
    EXPECT_EQ(changed_outside(p.bbuf->data(), 0x22), 0u);

    ASSERT_TRUE(transfer(p, p.a.get(), ac.a_to_b, p.amem, *cdesc, Direction::kWrite).ok());
    EXPECT_EQ(pattern_mismatches(cbuf.data(), 1), 0u);
    fill_pattern(cbuf.data() + kOffset, kLen, 2);
    ASSERT_TRUE(transfer(p, p.a.get(), ac.a_to_b, p.amem, *cdesc, Direction::kRead).ok());
    EXPECT_EQ(pattern_mismatches(p.abuf->data(), 2), 0u);
    EXPECT_TRUE(p.abuf->canaries_intact());
    EXPECT_TRUE(p.bbuf->canaries_intact());
    EXPECT_TRUE(cbuf.canaries_intact());
}

TEST(EngineFault, ResetOfOnePeersCommLeavesTheOtherPeerWorking) {
    // isend rules on receive comms never fire: naming all four hits the send comm that carries
    // the first chunk, whichever number it got.
    second_peer_keeps_working(
        "reset:isend:1@comm1,reset:isend:1@comm2,reset:isend:1@comm3,reset:isend:1@comm4");
}

TEST(EngineFault, DropOnOnePeersCommLeavesTheOtherPeerWorking) {
    second_peer_keeps_working(
        "drop:isend:2@comm1,drop:isend:2@comm2,drop:isend:2@comm3,drop:isend:2@comm4");
}

// A host-memory transfer of up to XFER_INLINE_ALONE (WRITE) or XFER_INLINE_ALONE_READ (READ),
// both set to 64 KiB here, that has its peer to itself rides in its control message: a data
// channel whose every send fails is never used, for a WRITE (the initiator's sends) or a READ
// (the target's, asked by the reader). Without the rule (both 0) the same transfers take the
// data channel and fail. A target whose MAX_CTRL_MESSAGE is the smallest allowed takes the
// 64 KiB of data on top of it.
TEST(EngineFault, ALoneSmallHostTransferTravelsInline) {
    for (const bool alone_inline : {true, false}) {
        SCOPED_TRACE(alone_inline ? "XFER_INLINE_ALONE 64 KiB" : "XFER_INLINE_ALONE 0");
        for (const Direction dir : {Direction::kWrite, Direction::kRead}) {
            SCOPED_TRACE(dir == Direction::kWrite ? "write" : "read");
            Config ca = fault_config(dir == Direction::kWrite ? "fail:isend:1" : "");
            Config cb = fault_config(dir == Direction::kRead ? "fail:isend:1" : "");
            cb.max_ctrl_message = 64 * 1024;
            ca.max_ctrl_message = 64 * 1024;
            // (a notification must fit in the control message: MAX_NOTIFICATION_SIZE too)
            ca.max_notification_size = cb.max_notification_size = 32 * 1024;
            // Off: any value up to XFER_INLINE_THRESHOLD (0 would pick one by the machine).
            const uint64_t alone = alone_inline ? 64 * 1024 : 1;
            ca.xfer_inline_busy = cb.xfer_inline_busy = 1;  // (that rule off: this one alone)
            ca.xfer_inline_alone = cb.xfer_inline_alone = alone;
            ca.xfer_inline_alone_read = cb.xfer_inline_alone_read = alone;
            Pair p;
            ASSERT_TRUE(p.open(ca, cb));
            constexpr uint64_t kLen64K = 64 * 1024;
            GuardedBuffer* src = dir == Direction::kWrite ? p.abuf.get() : p.bbuf.get();
            GuardedBuffer* dst = dir == Direction::kWrite ? p.bbuf.get() : p.abuf.get();
            fill_pattern(src->data() + kOffset, kLen64K, 77);
            auto x = dir == Direction::kWrite
                         ? p.a->write(p.link.a_to_b, p.amem, kOffset, p.bdesc, kOffset, kLen64K)
                         : p.a->read(p.link.a_to_b, p.amem, kOffset, p.bdesc, kOffset, kLen64K);
            ASSERT_TRUE(x.ok()) << x.status().to_string();
            const Status st = p.a->wait(*x, kBound);
            ASSERT_NE(st.code(), StatusCode::kTimeout) << st.to_string();
            if (alone_inline) {
                ASSERT_TRUE(st.ok()) << st.to_string();
                EXPECT_EQ(find_pattern_mismatch(dst->data() + kOffset, kLen64K, 77), -1);
                // One byte past 64 KiB is a chunk on the data channel again: it fails.
                auto big = p.a->write(p.link.a_to_b, p.amem, 0, p.bdesc, 0, kLen64K + 1);
                if (dir == Direction::kWrite) {
                    ASSERT_TRUE(big.ok());
                    EXPECT_FALSE(p.a->wait(*big, kBound).ok());
                }
            } else {
                EXPECT_FALSE(st.ok());
            }
            EXPECT_TRUE(p.abuf->canaries_intact());
            EXPECT_TRUE(p.bbuf->canaries_intact());
        }
    }
}

// Where the thread making progress does the socket I/O, the automatic limits differ by
// direction (measured: docs/engine.md): a lone WRITE rides inline up to 256 KiB, a lone READ up
// to 64 KiB. One byte more takes the data channel, whose sends fail here.
TEST(EngineFault, LoneWritesRideInlineFurtherThanLoneReads) {
    Config in = engine_test_config();
    in.socket_io = "caller";
    const Config defaults = in.effective();
    ASSERT_EQ(defaults.xfer_inline_alone, 256u * 1024);
    ASSERT_EQ(defaults.xfer_inline_alone_read, 64u * 1024);
    for (const Direction dir : {Direction::kWrite, Direction::kRead}) {
        SCOPED_TRACE(dir == Direction::kWrite ? "write" : "read");
        const uint64_t limit =
            dir == Direction::kWrite ? defaults.xfer_inline_alone : defaults.xfer_inline_alone_read;
        Pair p;
        Config ca = fault_config(dir == Direction::kWrite ? "fail:isend:1" : "");
        Config cb = fault_config(dir == Direction::kRead ? "fail:isend:1" : "");
        ca.socket_io = cb.socket_io = "caller";
        ASSERT_TRUE(p.open(ca, cb));
        GuardedBuffer* src = dir == Direction::kWrite ? p.abuf.get() : p.bbuf.get();
        GuardedBuffer* dst = dir == Direction::kWrite ? p.bbuf.get() : p.abuf.get();
        fill_pattern(src->data() + kOffset, limit + 1, 78);
        auto post = [&](uint64_t len) {
            return dir == Direction::kWrite
                       ? p.a->write(p.link.a_to_b, p.amem, kOffset, p.bdesc, kOffset, len)
                       : p.a->read(p.link.a_to_b, p.amem, kOffset, p.bdesc, kOffset, len);
        };
        auto x = post(limit);
        ASSERT_TRUE(x.ok()) << x.status().to_string();
        ASSERT_TRUE(p.a->wait(*x, kBound).ok()) << "a lone transfer of the limit went by a channel";
        EXPECT_EQ(find_pattern_mismatch(dst->data() + kOffset, limit, 78), -1);
        auto over = post(limit + 1);
        ASSERT_TRUE(over.ok()) << over.status().to_string();
        EXPECT_FALSE(p.a->wait(*over, kBound).ok()) << "one byte past the limit still went inline";
        EXPECT_TRUE(p.abuf->canaries_intact());
        EXPECT_TRUE(p.bbuf->canaries_intact());
    }
}

// Host-memory transfers of up to XFER_INLINE_BUSY (automatic: 64 KiB where the thread making
// progress does the socket I/O, 32 KiB with I/O threads) ride inline when others are in flight
// too: eight posted back to back over a data channel whose every send fails all succeed, WRITE
// and READ. With the rule off (XFER_INLINE_BUSY at the threshold) they take the channel and fail;
// one byte past the limit takes it too. (A READ goes inline where the reader asks and the
// target's XFER_INLINE_ALONE_READ allows: the reader asks here by XFER_INLINE_BUSY alone, whether
// the read is alone or not.)
TEST(EngineFault, SmallHostTransfersUnderLoadTravelInline) {
    for (const char* io : {"caller", "threads"}) {
        for (const bool busy_inline : {true, false}) {
            SCOPED_TRACE(io);
            SCOPED_TRACE(busy_inline ? "XFER_INLINE_BUSY automatic" : "XFER_INLINE_BUSY off");
            const uint64_t limit = std::string(io) == "caller" ? 64 * 1024 : 32 * 1024;
            for (const Direction dir : {Direction::kWrite, Direction::kRead}) {
                SCOPED_TRACE(dir == Direction::kWrite ? "write" : "read");
                Config ca = fault_config(dir == Direction::kWrite ? "fail:isend:1" : "");
                Config cb = fault_config(dir == Direction::kRead ? "fail:isend:1" : "");
                ca.socket_io = cb.socket_io = io;
                // (The initiator's rules for a lone transfer off, so that none of these goes inline
                // by them; the target answers a read inline when asked, up to 64 KiB.)
                ca.xfer_inline_alone = cb.xfer_inline_alone = 1;
                ca.xfer_inline_alone_read = 1;
                cb.xfer_inline_alone_read = 64 * 1024;
                if (!busy_inline) ca.xfer_inline_busy = cb.xfer_inline_busy = 1;
                ASSERT_EQ(ca.effective().xfer_inline_busy, busy_inline ? limit : 1u);
                Pair p;
                ASSERT_TRUE(p.open(ca, cb));
                constexpr int kN = 8;
                GuardedBuffer* src = dir == Direction::kWrite ? p.abuf.get() : p.bbuf.get();
                GuardedBuffer* dst = dir == Direction::kWrite ? p.bbuf.get() : p.abuf.get();
                fill_pattern(src->data() + kOffset, kN * limit + 1, 79);
                auto post = [&](uint64_t off, uint64_t len) {
                    return dir == Direction::kWrite
                               ? p.a->write(p.link.a_to_b, p.amem, off, p.bdesc, off, len)
                               : p.a->read(p.link.a_to_b, p.amem, off, p.bdesc, off, len);
                };
                // (A failed channel fails the peer: with the rule off, later posts may be refused.)
                std::vector<XferId> ids;
                int failed = 0;
                for (int i = 0; i < kN; ++i) {
                    auto x = post(kOffset + i * limit, limit);
                    if (x.ok()) {
                        ids.push_back(*x);
                    } else {
                        ASSERT_FALSE(busy_inline) << x.status().to_string();
                        ++failed;
                    }
                }
                for (XferId id : ids) {
                    const Status st = p.a->wait(id, kBound);
                    ASSERT_NE(st.code(), StatusCode::kTimeout) << st.to_string();
                    if (!st.ok()) ++failed;
                }
                if (busy_inline) {
                    EXPECT_EQ(failed, 0);
                    EXPECT_EQ(find_pattern_mismatch(dst->data() + kOffset, kN * limit, 79), -1);
                    // One byte past the limit, posted beside another: a chunk on the data channel.
                    auto beside = post(kOffset, limit);
                    auto over = post(kOffset + limit, limit + 1);
                    ASSERT_TRUE(beside.ok() && over.ok());
                    EXPECT_FALSE(p.a->wait(*over, kBound).ok())
                        << "past the limit and still inline";
                    (void)p.a->wait(*beside, kBound);  // (fails with the peer, or was done before)
                } else {
                    EXPECT_EQ(failed, kN) << "inline with the rule off";
                }
                EXPECT_TRUE(p.abuf->canaries_intact());
                EXPECT_TRUE(p.bbuf->canaries_intact());
            }
        }
    }
}

TEST(EngineFault, MalformedFaultSpecIsRefusedAtCreation) {
    auto ep = Endpoint::create(fault_config("fail:isend:1,bogus"), "x");
    ASSERT_FALSE(ep.ok());
    EXPECT_EQ(ep.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(ep.status().message().find("'bogus'"), std::string::npos) << ep.status().to_string();
}

}  // namespace
}  // namespace tcpx::testing
