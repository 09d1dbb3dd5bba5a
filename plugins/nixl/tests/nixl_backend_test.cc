// The NIXL backend "TCPX" driven through NIXL's public agent API, with the agents in this
// process: transfers of many descriptors, reposting, notifications, releasing requests in
// flight, inbound peers, local transfers, the progress-thread option, backend parameters and
// concurrent use. Every transferred byte is checked, and so is every byte that should not have
// changed.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "nixl_test_util.h"
#include "tcpx/config.h"
#include "tests/support/alloc_fault.h"

namespace tcpx::nixl_test {
namespace {

using std::chrono::milliseconds;
using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;

const char* op_name(nixl_xfer_op_t op) { return op == NIXL_WRITE ? "Write" : "Read"; }
const char* mem_name(nixl_mem_t mem) { return mem == VRAM_SEG ? "Vram" : "Dram"; }

// Where `got` first differs from `want`, for a readable failure.
::testing::AssertionResult same_bytes(const std::vector<uint8_t>& got,
                                      const std::vector<uint8_t>& want) {
    if (got.size() != want.size()) {
        return ::testing::AssertionFailure()
               << "sizes differ: " << got.size() << " vs " << want.size();
    }
    auto [g, w] = std::mismatch(got.begin(), got.end(), want.begin());
    if (g == got.end()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "first difference at byte " << (g - got.begin()) << " of " << got.size() << ": got "
           << int(*g) << ", want " << int(*w);
}

// --- descriptor layouts -------------------------------------------------------------------------

// One descriptor: `len` bytes at `local` in the initiator's buffer and `remote` in the target's.
struct Piece {
    uint64_t local = 0;
    uint64_t remote = 0;
    uint64_t len = 0;
};

// 64 pieces of varied sizes (1 byte to 3 MiB) at offsets inside the registrations, with gaps
// between them, in a different order on each side. The target's buffer is registered as two
// registrations, cut at `remote_cut` (in a gap).
struct Layout {
    std::vector<Piece> pieces;
    size_t local_size = 0;
    size_t remote_size = 0;
    uint64_t remote_cut = 0;

    Ranges local_ranges() const {
        Ranges r;
        for (const Piece& p : pieces) r.emplace_back(p.local, p.len);
        return r;
    }
    Ranges remote_ranges() const {
        Ranges r;
        for (const Piece& p : pieces) r.emplace_back(p.remote, p.len);
        return r;
    }
};

Layout make_layout(uint64_t seed, size_t count = 64) {
    std::mt19937_64 rng(seed);
    std::vector<uint64_t> sizes = {1,
                                   2,
                                   3,
                                   7,
                                   8,
                                   9,
                                   63,
                                   64,
                                   65,
                                   4095,
                                   4096,
                                   4097,
                                   65535,
                                   65536,
                                   65537,
                                   1 << 20,
                                   (1 << 20) + 1,
                                   (2 << 20) + 3,
                                   3 << 20};
    while (sizes.size() < count) sizes.push_back(1 + rng() % 100000);
    sizes.resize(count);
    std::shuffle(sizes.begin(), sizes.end(), rng);
    Layout l;
    l.pieces.resize(count);
    uint64_t at = 13;  // nothing starts at a registration's first byte
    for (size_t i = 0; i < count; ++i) {
        l.pieces[i].len = sizes[i];
        l.pieces[i].remote = at;
        at += sizes[i];
        if (i == count / 2 - 1) l.remote_cut = at + 1;
        at += 1 + rng() % 97;
    }
    l.remote_size = at + 29;
    std::vector<size_t> order(count);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    at = 5;
    for (size_t i : order) {
        l.pieces[i].local = at;
        at += l.pieces[i].len + 1 + rng() % 61;
    }
    l.local_size = at + 31;
    return l;
}

// `base` with the pieces copied in from `from` (`to_remote`: into the remote offsets).
std::vector<uint8_t> apply(std::vector<uint8_t> base, const std::vector<uint8_t>& from,
                           const Layout& l, bool to_remote) {
    for (const Piece& p : l.pieces) {
        const uint64_t src = to_remote ? p.local : p.remote;
        const uint64_t dst = to_remote ? p.remote : p.local;
        std::memcpy(base.data() + dst, from.data() + src, p.len);
    }
    return base;
}

// --- 1 and 7: many descriptors, both memory kinds, with and without progress threads ----------

struct XferParam {
    nixl_mem_t local_mem;
    nixl_mem_t remote_mem;
    bool initiator_thread;  // the agents' useProgThread
    bool target_thread;
};

std::string describe(const XferParam& p) {
    return std::string(mem_name(p.local_mem)) + "To" + mem_name(p.remote_mem) +
           (p.initiator_thread ? "_InitThread" : "_InitPolled") +
           (p.target_thread ? "_TargetThread" : "_TargetPolled");
}
// For test names and gtest's listing (which CTest names the tests after): no raw bytes.
void PrintTo(const XferParam& p, std::ostream* os) { *os << describe(p); }
std::string xfer_param_name(const ::testing::TestParamInfo<XferParam>& info) {
    return describe(info.param);
}

class ManyDescs : public ::testing::TestWithParam<XferParam> {
 protected:
    void SetUp() override {
        const XferParam& p = GetParam();
        if ((p.local_mem == VRAM_SEG || p.remote_mem == VRAM_SEG) && !have_gpu()) {
            GTEST_SKIP() << "no GPU";
        }
    }

    // A WRITE or READ of the 64 pieces with a notification; checks every byte of both buffers.
    void run(nixl_xfer_op_t op) {
        const XferParam& p = GetParam();
        const Layout l = make_layout(op == NIXL_WRITE ? 1 : 2);
        auto local = Buffer::create(p.local_mem, l.local_size);
        auto remote = Buffer::create(p.remote_mem, l.remote_size);
        ASSERT_TRUE(local && remote);
        local->fill(11);
        remote->fill(22);
        const auto local_before = local->read_all();
        const auto remote_before = remote->read_all();

        TestAgent a("many-a", {.prog_thread = p.initiator_thread});
        TestAgent b("many-b", {.prog_thread = p.target_thread});
        ASSERT_TRUE(a.reg(*local));
        ASSERT_TRUE(b.reg(*remote, 0, l.remote_cut));
        ASSERT_TRUE(b.reg(*remote, l.remote_cut, l.remote_size - l.remote_cut));
        ASSERT_EQ(a.load(b), "many-b");

        const std::string msg = std::string("many-") + op_name(op);
        const nixl_opt_args_t args = with_notif(msg);
        nixlXferReqH* req = nullptr;
        ASSERT_EQ(a->createXferReq(op, xfer_list(*local, l.local_ranges()),
                                   xfer_list(*remote, l.remote_ranges()), "many-b", req, &args),
                  NIXL_SUCCESS);
        EXPECT_EQ(post_and_wait(a, req, {&b}), NIXL_SUCCESS);
        ASSERT_TRUE(wait_notifs(b, 1, {&a}));
        pump_for(milliseconds(50), {&a, &b});
        EXPECT_EQ(b.received(), (std::vector<Notif>{{"many-a", msg}}));
        EXPECT_TRUE(a.received().empty());
        EXPECT_EQ(a->releaseXferReq(req), NIXL_SUCCESS);

        if (op == NIXL_WRITE) {
            EXPECT_TRUE(
                same_bytes(remote->read_all(), apply(remote_before, local_before, l, true)));
            EXPECT_TRUE(same_bytes(local->read_all(), local_before));
        } else {
            EXPECT_TRUE(
                same_bytes(local->read_all(), apply(local_before, remote_before, l, false)));
            EXPECT_TRUE(same_bytes(remote->read_all(), remote_before));
        }
        EXPECT_TRUE(local->guards_intact());
        EXPECT_TRUE(remote->guards_intact());
    }
};

TEST_P(ManyDescs, Write) { run(NIXL_WRITE); }
TEST_P(ManyDescs, Read) { run(NIXL_READ); }

// Host memory, with every combination of progress threads: without one, an agent's backend
// progresses only inside getXferStatus (initiator) and getNotifs (target).
INSTANTIATE_TEST_SUITE_P(Dram, ManyDescs,
                         ::testing::Values(XferParam{DRAM_SEG, DRAM_SEG, true, true},
                                           XferParam{DRAM_SEG, DRAM_SEG, false, false},
                                           XferParam{DRAM_SEG, DRAM_SEG, true, false},
                                           XferParam{DRAM_SEG, DRAM_SEG, false, true}),
                         xfer_param_name);
// GPU memory on either side (skipped without a GPU).
INSTANTIATE_TEST_SUITE_P(Vram, ManyDescs,
                         ::testing::Values(XferParam{VRAM_SEG, VRAM_SEG, true, true},
                                           XferParam{DRAM_SEG, VRAM_SEG, true, true},
                                           XferParam{VRAM_SEG, DRAM_SEG, true, true},
                                           XferParam{VRAM_SEG, VRAM_SEG, false, false}),
                         xfer_param_name);

// --- two agents, host memory: a fixture for the tests below ------------------------------------

// Agents "a" (initiator) and "b" (target) with a buffer each, a having loaded b's metadata.
class TwoAgents : public ::testing::Test {
 protected:
    void start(size_t size, AgentOptions a_options = {}, AgentOptions b_options = {},
               const std::string& prefix = "two") {
        a_name_ = prefix + "-a";
        b_name_ = prefix + "-b";
        src_ = Buffer::create(DRAM_SEG, size);
        dst_ = Buffer::create(DRAM_SEG, size);
        ASSERT_TRUE(src_ && dst_);
        a_ = std::make_unique<TestAgent>(a_name_, a_options);
        b_ = std::make_unique<TestAgent>(b_name_, b_options);
        ASSERT_TRUE(a_->reg(*src_));
        ASSERT_TRUE(b_->reg(*dst_));
        ASSERT_EQ(a_->load(*b_), b_name_);
    }
    void TearDown() override {
        a_.reset();  // the agents go before the memory they registered
        b_.reset();
    }

    // A request for [offset, offset + len) of both buffers.
    nixlXferReqH* request(nixl_xfer_op_t op, uint64_t offset, uint64_t len,
                          const nixl_opt_args_t* args = nullptr) {
        nixlXferReqH* req = nullptr;
        EXPECT_EQ((*a_)->createXferReq(op, xfer_list(*src_, {{offset, len}}),
                                       xfer_list(*dst_, {{offset, len}}), b_name_, req, args),
                  NIXL_SUCCESS);
        return req;
    }

    std::string a_name_, b_name_;
    std::unique_ptr<Buffer> src_, dst_;
    std::unique_ptr<TestAgent> a_, b_;
};

// --- 2: reposting -------------------------------------------------------------------------------

// A handle reposted after completion moves the data as it is at that post, with the
// notification given to that post; a post without one notifies nobody.
TEST_F(TwoAgents, RepostAfterCompletion) {
    constexpr size_t kSize = 3 << 20;
    start(kSize, {}, {}, "repost");
    const Ranges ranges = {{0, 1}, {4097, 65536}, {1 << 20, (1 << 20) + 5}};
    for (nixl_xfer_op_t op : {NIXL_WRITE, NIXL_READ}) {
        SCOPED_TRACE(op_name(op));
        nixlXferReqH* req = nullptr;
        ASSERT_EQ((*a_)->createXferReq(op, xfer_list(*src_, ranges), xfer_list(*dst_, ranges),
                                       b_name_, req),
                  NIXL_SUCCESS);
        const size_t seen = b_->received().size();
        for (int k = 0; k < 4; ++k) {
            SCOPED_TRACE(k);
            Buffer& from = op == NIXL_WRITE ? *src_ : *dst_;
            Buffer& to = op == NIXL_WRITE ? *dst_ : *src_;
            from.fill(100 + 10 * op + k);  // new data for every post
            const auto to_before = to.read_all();
            const std::string msg = std::string(op_name(op)) + "-post-" + std::to_string(k);
            const nixl_opt_args_t args = with_notif(msg);
            ASSERT_EQ(post_and_wait(*a_, req, {b_.get()}, &args), NIXL_SUCCESS);
            ASSERT_TRUE(wait_notifs(*b_, seen + k + 1));
            EXPECT_EQ(b_->received().back(), (Notif{a_name_, msg}));
            auto want = to_before;
            const auto from_bytes = from.read_all();
            for (const auto& [off, len] : ranges) {
                std::memcpy(want.data() + off, from_bytes.data() + off, len);
            }
            EXPECT_TRUE(same_bytes(to.read_all(), want));
        }
        // A repost whose arguments carry no notification sends none.
        const nixl_opt_args_t no_notif;
        ASSERT_EQ(post_and_wait(*a_, req, {b_.get()}, &no_notif), NIXL_SUCCESS);
        pump_for(milliseconds(100), {b_.get()});
        EXPECT_EQ(b_->received().size(), seen + 4);
        EXPECT_EQ((*a_)->releaseXferReq(req), NIXL_SUCCESS);
    }
}

// Reposting a handle whose transfer is still in flight is NIXL_ERR_REPOST_ACTIVE, and changes
// nothing: the transfer in flight completes with its own notification, exactly once. The target
// has no progress thread and is not called between the post and the repost, so the transfer
// cannot complete in between (rather than hoping a large one is slow enough): first while the
// connection is being made, then with it made.
TEST_F(TwoAgents, RepostWhileActiveIsRefused) {
    constexpr size_t kSize = 8 << 20;
    start(kSize, {}, {.prog_thread = false}, "active");
    nixlXferReqH* req = request(NIXL_WRITE, 0, kSize);
    ASSERT_NE(req, nullptr);
    for (int k = 0; k < 2; ++k) {
        SCOPED_TRACE(k == 0 ? "connecting" : "connected");
        src_->fill(70 + k);
        const nixl_opt_args_t args = with_notif("active-" + std::to_string(k));
        ASSERT_EQ((*a_)->postXferReq(req, &args), NIXL_IN_PROG);
        const nixl_opt_args_t refused = with_notif("refused");
        EXPECT_EQ((*a_)->postXferReq(req, &refused), NIXL_ERR_REPOST_ACTIVE);
        EXPECT_EQ(wait_xfer(*a_, req, {b_.get()}), NIXL_SUCCESS);
        EXPECT_TRUE(same_bytes(dst_->read_all(), src_->read_all()));
        ASSERT_TRUE(wait_notifs(*b_, k + 1));
        EXPECT_EQ(b_->received().back(), (Notif{a_name_, "active-" + std::to_string(k)}));
    }
    pump_for(milliseconds(100), {b_.get()});
    EXPECT_EQ(b_->received().size(), 2u);
    EXPECT_EQ(b_->count({a_name_, "refused"}), 0u);
    EXPECT_EQ((*a_)->releaseXferReq(req), NIXL_SUCCESS);
}

// --- 3: notifications ---------------------------------------------------------------------------

class Notifications : public TwoAgents, public ::testing::WithParamInterface<bool> {
 protected:
    void SetUp() override {
        start(16 << 20, {.prog_thread = GetParam()}, {.prog_thread = GetParam()}, "notif");
    }

    // A WRITE of [0, len) with notification `msg`; checks it arrives exactly once.
    void write_with(const std::string& msg, size_t len) {
        src_->fill(msg.size() + len);
        const nixl_opt_args_t args = with_notif(msg);
        nixlXferReqH* req = request(NIXL_WRITE, 0, len, &args);
        ASSERT_NE(req, nullptr);
        ASSERT_EQ(post_and_wait(*a_, req, {b_.get()}), NIXL_SUCCESS);
        EXPECT_EQ((*a_)->releaseXferReq(req), NIXL_SUCCESS);
        ASSERT_TRUE(wait_notifs(*b_, 1, {a_.get()}));
        pump_for(milliseconds(100), {a_.get(), b_.get()});  // nothing more may come
        EXPECT_EQ(b_->received(), (std::vector<Notif>{{a_name_, msg}}));
        std::vector<uint8_t> got(len), want(len);
        dst_->read(0, got.data(), len);
        src_->read(0, want.data(), len);
        EXPECT_TRUE(same_bytes(got, want));
        std::vector<uint8_t> after(4096);  // the target's bytes behind the range: still zero
        dst_->read(len, after.data(), after.size());
        EXPECT_TRUE(same_bytes(after, std::vector<uint8_t>(after.size())));
    }
};

std::string binary_payload(size_t size) {
    std::string s(size, '\0');
    for (size_t i = 0; i < size; ++i) s[i] = static_cast<char>(pattern_byte(5, i));
    s[0] = '\0';  // NUL bytes anywhere, including first and last
    s[size - 1] = '\0';
    s[size / 2] = '\xff';
    return s;
}

TEST_P(Notifications, WithPayload) { write_with("the payload", 4096); }
TEST_P(Notifications, EmptyPayload) { write_with("", 4096); }
TEST_P(Notifications, BinaryPayload) { write_with(binary_payload(1000), 3 << 20); }
TEST_P(Notifications, LargeBinaryPayload) { write_with(binary_payload(256 << 10), 100); }
TEST_P(Notifications, InlineSizedWrite) { write_with("tiny", 1); }

// genNotif on its own: every kind of payload, each exactly once and in order.
TEST_P(Notifications, Standalone) {
    const std::vector<std::string> msgs = {"hello", "", binary_payload(333), "x"};
    for (const std::string& m : msgs) EXPECT_EQ((*a_)->genNotif(b_name_, m), NIXL_SUCCESS);
    ASSERT_TRUE(wait_notifs(*b_, msgs.size(), {a_.get()}));
    pump_for(milliseconds(100), {a_.get(), b_.get()});
    std::vector<Notif> want;
    for (const std::string& m : msgs) want.push_back({a_name_, m});
    EXPECT_EQ(b_->received(), want);
    EXPECT_TRUE(a_->received().empty());
}

// genNotif past the target's room (its backend's max_queued_notifications) waits until the
// target's getNotifs makes room: every one arrives, in order, and the connection lives (it
// ended the connection before). With and without progress threads.
TEST(NixlNotifications, StandalonePastTheTargetsRoomWaitsForIt) {
    for (const bool prog : {true, false}) {
        SCOPED_TRACE(prog);
        const std::string suffix = prog ? "-thread" : "-polled";
        AgentOptions bo{.prog_thread = prog};
        bo.params["max_queued_notifications"] = "4";
        TestAgent a("room-a" + suffix, {.prog_thread = prog});
        TestAgent b("room-b" + suffix, bo);
        ASSERT_EQ(a.load(b), b.name());
        constexpr int kNotes = 300;
        std::vector<Notif> want;
        for (int i = 0; i < kNotes; ++i) {
            want.push_back({a.name(), "n" + std::to_string(i)});
            ASSERT_EQ(a->genNotif(b.name(), want.back().msg), NIXL_SUCCESS) << i;
        }
        ASSERT_TRUE(wait_notifs(b, kNotes, {&a})) << b.received().size();
        EXPECT_EQ(b.received(), want);
        // The connection lived through it.
        EXPECT_EQ(a->genNotif(b.name(), "after"), NIXL_SUCCESS);
        ASSERT_TRUE(wait_notifs(b, kNotes + 1, {&a}));
        EXPECT_EQ(b.received().back(), (Notif{a.name(), "after"}));
    }
}

// A WRITE's notification is seen only once all of its data is visible in the target's memory:
// checked at the moment the notification is seen, before the initiator is asked about it.
TEST_P(Notifications, WriteNotificationFollowsData) {
    constexpr size_t kSize = 16 << 20;
    for (int round = 0; round < 3; ++round) {
        SCOPED_TRACE(round);
        src_->fill(40 + round);
        const auto want = src_->read_all();
        const std::string msg = "written-" + std::to_string(round);
        bool checked = false;
        b_->on_notif = [&](const Notif& n) {
            if (n.msg != msg) return;
            checked = true;
            EXPECT_TRUE(same_bytes(dst_->read_all(), want)) << "at notification time";
        };
        // 16 descriptors, so that a partial completion would show.
        Ranges ranges;
        for (uint64_t off = 0; off < kSize; off += kSize / 16) ranges.emplace_back(off, kSize / 16);
        const nixl_opt_args_t args = with_notif(msg);
        nixlXferReqH* req = nullptr;
        ASSERT_EQ((*a_)->createXferReq(NIXL_WRITE, xfer_list(*src_, ranges),
                                       xfer_list(*dst_, ranges), b_name_, req, &args),
                  NIXL_SUCCESS);
        nixl_status_t st = (*a_)->postXferReq(req);
        ASSERT_GE(st, 0);
        // The target looks first, then the initiator, so the target may see the notification
        // while the transfer is still in progress for the initiator.
        const auto deadline = std::chrono::steady_clock::now() + kTimeout;
        while (!checked && std::chrono::steady_clock::now() < deadline) {
            ASSERT_EQ(b_->pump(), NIXL_SUCCESS);
            if (st == NIXL_IN_PROG) st = (*a_)->getXferStatus(req);
            ASSERT_GE(st, 0);
        }
        EXPECT_TRUE(checked);
        if (st == NIXL_IN_PROG) st = wait_xfer(*a_, req, {b_.get()});
        EXPECT_EQ(st, NIXL_SUCCESS);
        EXPECT_EQ((*a_)->releaseXferReq(req), NIXL_SUCCESS);
        b_->on_notif = nullptr;
    }
    pump_for(milliseconds(50), {b_.get()});
    EXPECT_EQ(b_->received().size(), 3u);
}

// A READ's notification is seen only once all of its data is in the initiator's memory:
// checked at the moment the notification is seen. The engine sends it when the read completes,
// which may be before the initiator's getXferStatus reports it (a progress thread), or inside
// the getXferStatus that does (none).
TEST_P(Notifications, ReadNotificationFollowsData) {
    constexpr size_t kSize = 16 << 20;
    dst_->fill(77);
    src_->fill(78);
    const auto want = dst_->read_all();
    bool seen = false;
    b_->on_notif = [&](const Notif& n) {
        seen = true;
        EXPECT_EQ(n, (Notif{a_name_, "read-done"}));
        EXPECT_TRUE(same_bytes(src_->read_all(), want)) << "at notification time";
    };
    // 16 descriptors, so that a partial completion would show.
    Ranges ranges;
    for (uint64_t off = 0; off < kSize; off += kSize / 16) ranges.emplace_back(off, kSize / 16);
    const nixl_opt_args_t args = with_notif("read-done");
    nixlXferReqH* req = nullptr;
    ASSERT_EQ((*a_)->createXferReq(NIXL_READ, xfer_list(*src_, ranges), xfer_list(*dst_, ranges),
                                   b_name_, req, &args),
              NIXL_SUCCESS);
    nixl_status_t st = (*a_)->postXferReq(req);
    const auto deadline = std::chrono::steady_clock::now() + kTimeout;
    while (st == NIXL_IN_PROG && std::chrono::steady_clock::now() < deadline) {
        ASSERT_EQ(b_->pump(), NIXL_SUCCESS);  // the target looks before each check
        st = (*a_)->getXferStatus(req);
    }
    ASSERT_EQ(st, NIXL_SUCCESS);
    ASSERT_TRUE(wait_notifs(*b_, 1));
    pump_for(milliseconds(100), {a_.get(), b_.get()});
    EXPECT_TRUE(seen);
    EXPECT_EQ(b_->received().size(), 1u);
    EXPECT_EQ((*a_)->releaseXferReq(req), NIXL_SUCCESS);
    b_->on_notif = nullptr;
}

INSTANTIATE_TEST_SUITE_P(ProgressThread, Notifications, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                             return info.param ? "On" : "Off";
                         });

// A READ's notification needs nothing more from the initiator's application than the post:
// the initiator's progress thread sends it once the data is in place. Nobody asks the initiator
// about the transfer until the target has the notification (only the target is called, with or
// without a progress thread of its own), and the data is checked at that moment.
class ReadNotificationUnasked : public TwoAgents, public ::testing::WithParamInterface<bool> {};

TEST_P(ReadNotificationUnasked, ReachesTheTarget) {
    constexpr size_t kSize = 16 << 20;
    start(kSize, {.prog_thread = true}, {.prog_thread = GetParam()}, "unasked");
    for (int round = 0; round < 3; ++round) {
        SCOPED_TRACE(round);
        src_->fill(60 + round);
        dst_->fill(90 + round);
        // Inline-sized, then 16 descriptors of 1 MiB.
        Ranges ranges = {{0, 100}};
        if (round > 0) {
            ranges.clear();
            for (uint64_t off = 0; off < kSize; off += kSize / 16) {
                ranges.emplace_back(off, kSize / 16);
            }
        }
        auto want = src_->read_all();
        const auto theirs = dst_->read_all();
        for (const auto& [off, len] : ranges) {
            std::memcpy(want.data() + off, theirs.data() + off, len);
        }
        const std::string msg = "unasked-" + std::to_string(round);
        bool checked = false;
        b_->on_notif = [&](const Notif& n) {
            EXPECT_EQ(n, (Notif{a_name_, msg}));
            checked = true;
            EXPECT_TRUE(same_bytes(src_->read_all(), want)) << "at notification time";
        };
        const nixl_opt_args_t args = with_notif(msg);
        nixlXferReqH* req = nullptr;
        ASSERT_EQ((*a_)->createXferReq(NIXL_READ, xfer_list(*src_, ranges),
                                       xfer_list(*dst_, ranges), b_name_, req, &args),
                  NIXL_SUCCESS);
        ASSERT_EQ((*a_)->postXferReq(req), NIXL_IN_PROG);
        ASSERT_TRUE(wait_notifs(*b_, static_cast<size_t>(round) + 1));  // calls the target only
        EXPECT_TRUE(checked);
        b_->on_notif = nullptr;
        EXPECT_EQ(wait_xfer(*a_, req, {b_.get()}), NIXL_SUCCESS);
        EXPECT_EQ((*a_)->releaseXferReq(req), NIXL_SUCCESS);
    }
    pump_for(milliseconds(100), {a_.get(), b_.get()});
    EXPECT_EQ(b_->received().size(), 3u);
}

INSTANTIATE_TEST_SUITE_P(TargetProgressThread, ReadNotificationUnasked, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                             return info.param ? "On" : "Off";
                         });

// --- 4: releasing a request in flight -----------------------------------------------------------

class ReleaseInFlight : public TwoAgents, public ::testing::WithParamInterface<nixl_xfer_op_t> {};

// The target has no progress thread and nobody calls into it, so a large transfer cannot
// complete: releasing it must return at once, and everything works afterwards. NIXL's contract:
// a release cancels the transfer, or fails if it cannot. A READ the target has not answered is
// cancelled: nothing lands in our memory, the target never gets its notification. A WRITE whose
// data is still being sent cannot be cut short (the target waits for every byte its request
// announced): its first release fails, NIXL keeps the handle with that status, the second frees
// it, and the write completes on its own, its notification once.
TEST_P(ReleaseInFlight, ReturnsPromptlyAndNothingBreaks) {
    const nixl_xfer_op_t op = GetParam();
    constexpr size_t kSize = 64 << 20;
    start(kSize, {}, {.prog_thread = false}, std::string("release-") + op_name(op));
    src_->fill(1);
    dst_->fill(2);
    // Connect (and check the path) with a small transfer while the target is served.
    nixlXferReqH* warm = request(op, 0, 4096);
    ASSERT_NE(warm, nullptr);
    ASSERT_EQ(post_and_wait(*a_, warm, {b_.get()}), NIXL_SUCCESS);
    EXPECT_EQ((*a_)->releaseXferReq(warm), NIXL_SUCCESS);

    const nixl_opt_args_t args = with_notif("released");
    nixlXferReqH* req = request(op, 0, kSize, &args);
    ASSERT_NE(req, nullptr);
    ASSERT_EQ((*a_)->postXferReq(req), NIXL_IN_PROG);
    std::this_thread::sleep_for(milliseconds(50));
    ASSERT_EQ((*a_)->getXferStatus(req), NIXL_IN_PROG) << "the target was expected to stall it";
    const auto t0 = std::chrono::steady_clock::now();
    const nixl_status_t released = (*a_)->releaseXferReq(req);
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_LT(took, milliseconds(500)) << "releaseXferReq waited for the transfer";
    if (op == NIXL_READ) {
        EXPECT_EQ(released, NIXL_SUCCESS);
    } else {
        EXPECT_EQ(released, NIXL_ERR_REPOST_ACTIVE);
        EXPECT_EQ((*a_)->getXferStatus(req), NIXL_ERR_REPOST_ACTIVE);  // (NIXL keeps it)
        // The target is served again: the write completes on its own, its notification once.
        ASSERT_TRUE(wait_notifs(*b_, 1, {a_.get()}));
        EXPECT_EQ(b_->received().back(), (Notif{a_name_, "released"}));
        // NIXL lets the handle be posted again (its status is an error): a new transfer, which
        // a release in flight cancels or fails anew (it once went unnoticed: the request kept
        // its failed release's marks, and the release succeeded with the transfer running).
        // (The target notifies, then acknowledges: until the old write has its acknowledgement
        // the handle is still active.)
        nixl_status_t reposted = NIXL_ERR_REPOST_ACTIVE;
        const auto until = std::chrono::steady_clock::now() + kTimeout;
        while (reposted == NIXL_ERR_REPOST_ACTIVE && std::chrono::steady_clock::now() < until) {
            ASSERT_EQ(b_->pump(), NIXL_SUCCESS);
            reposted = (*a_)->postXferReq(req);
        }
        ASSERT_EQ(reposted, NIXL_IN_PROG);
        std::this_thread::sleep_for(milliseconds(50));
        EXPECT_EQ((*a_)->releaseXferReq(req), NIXL_ERR_REPOST_ACTIVE);
        EXPECT_EQ((*a_)->releaseXferReq(req), NIXL_SUCCESS);  // the next frees it
        ASSERT_TRUE(wait_notifs(*b_, 2, {a_.get()}));
    }

    // New transfers, in both directions, on fresh buffers, work (the target served again; a
    // cancelled READ's data drains meanwhile).
    constexpr size_t kMore = 5 << 20;
    auto src2 = Buffer::create(DRAM_SEG, kMore);
    auto dst2 = Buffer::create(DRAM_SEG, kMore);
    ASSERT_TRUE(src2 && dst2);
    src2->fill(3);
    dst2->fill(4);
    ASSERT_TRUE(a_->reg(*src2));
    ASSERT_TRUE(b_->reg(*dst2));
    ASSERT_EQ(a_->load(*b_), b_name_);  // b's new registration
    for (nixl_xfer_op_t op2 : {NIXL_WRITE, NIXL_READ}) {
        SCOPED_TRACE(op_name(op2));
        if (op2 == NIXL_READ) dst2->fill(5);
        nixlXferReqH* next = nullptr;
        const nixl_opt_args_t next_args = with_notif(std::string("after-") + op_name(op2));
        ASSERT_EQ((*a_)->createXferReq(op2, xfer_list(*src2, {{0, kMore}}),
                                       xfer_list(*dst2, {{0, kMore}}), b_name_, next, &next_args),
                  NIXL_SUCCESS);
        ASSERT_EQ(post_and_wait(*a_, next, {b_.get()}), NIXL_SUCCESS);
        EXPECT_TRUE(same_bytes(src2->read_all(), dst2->read_all()));
        EXPECT_EQ((*a_)->releaseXferReq(next), NIXL_SUCCESS);
        const auto deadline = std::chrono::steady_clock::now() + kTimeout;
        while (b_->count({a_name_, next_args.notif.value()}) == 0 &&
               std::chrono::steady_clock::now() < deadline) {
            ASSERT_EQ(b_->pump(), NIXL_SUCCESS);
        }
        EXPECT_EQ(b_->count({a_name_, next_args.notif.value()}), 1u);
    }
    EXPECT_EQ(b_->count({a_name_, "released"}), op == NIXL_WRITE ? 2u : 0u);
    if (op == NIXL_READ) {
        // Nothing of the cancelled read landed in our memory (the warm-up read's 4 KiB did).
        const std::vector<uint8_t> ours = src_->read_all();
        const std::vector<uint8_t> before = make_pattern(kSize, 1);
        EXPECT_TRUE(std::equal(ours.begin() + 4096, ours.end(), before.begin() + 4096));
    }
    // Deregistration and destruction (TearDown) with the released transfer's history behind.
    a_->dereg_all();
    b_->dereg_all();
    EXPECT_TRUE(src_->guards_intact() && dst_->guards_intact());
}

// Out of memory while releasing a transfer in flight: the backend cannot note it, so the
// release fails and the request stays; NIXL then keeps the handle (releaseXferReq answers
// NIXL_ERR_REPOST_ACTIVE), which still answers getXferStatus and is released later. (The
// backend once freed the request all the same: the handle NIXL kept pointed at freed memory.)
// A WRITE whose data is still being sent cannot be cancelled, so its first release fails
// anyway; the fault moves through that release.
TEST_F(TwoAgents, AReleaseOutOfMemoryKeepsTheRequest) {
    constexpr size_t kSize = 64 << 20;
    start(kSize, {}, {.prog_thread = false}, "release-oom");
    src_->fill(1);
    nixlXferReqH* warm = request(NIXL_WRITE, 0, 4096);
    ASSERT_NE(warm, nullptr);
    ASSERT_EQ(post_and_wait(*a_, warm, {b_.get()}), NIXL_SUCCESS);
    EXPECT_EQ((*a_)->releaseXferReq(warm), NIXL_SUCCESS);
    // The target is not served: each transfer stays in flight. The fault moves one allocation
    // further each round until it hits the backend's note of the abandoned transfer.
    int kept = 0;
    size_t posted = 0;
    const nixl_opt_args_t args = with_notif("released");
    for (long skip = 0; skip < 16 && kept == 0; ++skip) {
        SCOPED_TRACE("allocation " + std::to_string(skip));
        nixlXferReqH* req = request(NIXL_WRITE, 0, kSize, &args);
        ASSERT_NE(req, nullptr);
        ++posted;
        ASSERT_EQ((*a_)->postXferReq(req), NIXL_IN_PROG);
        nixl_status_t st;
        {
            test::AllocFault fault("", skip, 1);
            st = (*a_)->releaseXferReq(req);
        }
        // The write's data is still being sent, so its release fails without a fault too (the
        // backend says NIXL_ERR_REPOST_ACTIVE); with one, with the backend's error. NIXL answers
        // NIXL_ERR_REPOST_ACTIVE for both, and keeps the backend's as the handle's status.
        EXPECT_EQ(st, NIXL_ERR_REPOST_ACTIVE);
        const nixl_status_t kept_as = (*a_)->getXferStatus(req);
        EXPECT_LT(kept_as, 0);
        if (kept_as != NIXL_ERR_REPOST_ACTIVE) ++kept;
        // NIXL releases it again on the next call, freeing its handle whatever the backend
        // answers: the backend's request must still be there for that, and must go then.
        EXPECT_EQ((*a_)->releaseXferReq(req), NIXL_SUCCESS);
    }
    EXPECT_EQ(kept, 1) << "no fault hit the release's note of the transfer";
    // The target served again: every released transfer completes on its own, its notification
    // once, and none holds memory at teardown.
    ASSERT_TRUE(wait_notifs(*b_, posted, {a_.get()}));
    EXPECT_EQ(b_->count({a_name_, "released"}), posted);
}

INSTANTIATE_TEST_SUITE_P(Op, ReleaseInFlight, ::testing::Values(NIXL_WRITE, NIXL_READ),
                         [](const ::testing::TestParamInfo<nixl_xfer_op_t>& info) {
                             return op_name(info.param);
                         });

// --- 5: an initiator the target knows nothing of ------------------------------------------------

// a loaded b's metadata; b never loaded a's. a's WRITE with a notification still reaches b,
// named after a. NIXL's agent lets b answer only once it knows a (genNotif requires the remote
// agent's metadata): with a's connection info alone (partial metadata, no registrations), b's
// reply reaches a.
TEST_F(TwoAgents, InboundFromUnknownAgent) {
    start(1 << 20, {}, {}, "inbound");
    src_->fill(9);
    const nixl_opt_args_t args = with_notif("from a stranger");
    nixlXferReqH* req = request(NIXL_WRITE, 0, 1 << 20, &args);
    ASSERT_NE(req, nullptr);
    ASSERT_EQ(post_and_wait(*a_, req, {b_.get()}), NIXL_SUCCESS);
    EXPECT_EQ((*a_)->releaseXferReq(req), NIXL_SUCCESS);
    ASSERT_TRUE(wait_notifs(*b_, 1));
    EXPECT_EQ(b_->received()[0], (Notif{a_name_, "from a stranger"}));
    EXPECT_TRUE(same_bytes(dst_->read_all(), src_->read_all()));

    // The agent refuses before the backend is asked.
    EXPECT_EQ((*b_)->genNotif(a_name_, "reply"), NIXL_ERR_NOT_FOUND);

    std::string conn_only;
    ASSERT_EQ((*a_)->getLocalPartialMD(nixl_reg_dlist_t(DRAM_SEG), conn_only), NIXL_SUCCESS);
    ASSERT_EQ(b_->load(conn_only), a_name_);
    EXPECT_EQ((*b_)->genNotif(a_name_, "reply"), NIXL_SUCCESS);
    ASSERT_TRUE(wait_notifs(*a_, 1, {b_.get()}));
    pump_for(milliseconds(100), {a_.get(), b_.get()});
    EXPECT_EQ(a_->received(), (std::vector<Notif>{{b_name_, "reply"}}));
    EXPECT_EQ(b_->received().size(), 1u);
}

// --- 5b: refusals and peers that go away ------------------------------------------------------

// b deregisters one of its two registrations; a, holding b's old metadata, transfers into it: the
// target refuses (NIXL_ERR_NOT_FOUND, after the grace in which a vanishing target would show its
// connection ending), nothing of b's memory changes, and the connection stays up: a transfer into
// the registration b kept works, without a new connection.
TEST_F(TwoAgents, RefusedByTheTargetIsNotFoundAndTheConnectionStays) {
    constexpr size_t kSize = 2 << 20;
    constexpr size_t kHalf = kSize / 2;
    a_name_ = "refused-a";
    b_name_ = "refused-b";
    src_ = Buffer::create(DRAM_SEG, kSize);
    dst_ = Buffer::create(DRAM_SEG, kSize);
    ASSERT_TRUE(src_ && dst_);
    a_ = std::make_unique<TestAgent>(a_name_);
    b_ = std::make_unique<TestAgent>(b_name_);
    ASSERT_TRUE(a_->reg(*src_));
    ASSERT_TRUE(b_->reg(*dst_, 0, kHalf));
    ASSERT_TRUE(b_->reg(*dst_, kHalf, kHalf));
    ASSERT_EQ(a_->load(*b_), b_name_);
    src_->fill(71);
    dst_->fill(72);

    // Connected and working first.
    nixlXferReqH* first = request(NIXL_WRITE, 0, 4096);
    ASSERT_NE(first, nullptr);
    ASSERT_EQ(post_and_wait(*a_, first, {b_.get()}), NIXL_SUCCESS);
    EXPECT_EQ((*a_)->releaseXferReq(first), NIXL_SUCCESS);

    ASSERT_TRUE(b_->dereg(*dst_, kHalf, kHalf));
    const auto before = dst_->read_all();
    for (nixl_xfer_op_t op : {NIXL_WRITE, NIXL_READ}) {
        SCOPED_TRACE(op_name(op));
        const nixl_opt_args_t args = with_notif("never");
        nixlXferReqH* req = request(op, kHalf + 100, 5000, &args);
        ASSERT_NE(req, nullptr);
        EXPECT_EQ(post_and_wait(*a_, req, {b_.get()}), NIXL_ERR_NOT_FOUND);
        EXPECT_EQ((*a_)->releaseXferReq(req), NIXL_SUCCESS);
    }
    EXPECT_TRUE(same_bytes(dst_->read_all(), before));

    src_->fill(73);
    const nixl_opt_args_t args = with_notif("after the refusal");
    nixlXferReqH* req = request(NIXL_WRITE, 4096, 64 << 10, &args);
    ASSERT_NE(req, nullptr);
    EXPECT_EQ(post_and_wait(*a_, req, {b_.get()}), NIXL_SUCCESS);
    EXPECT_EQ((*a_)->releaseXferReq(req), NIXL_SUCCESS);
    ASSERT_TRUE(wait_notifs(*b_, 1, {a_.get()}));
    pump_for(milliseconds(50), {a_.get(), b_.get()});
    EXPECT_EQ(b_->received(), (std::vector<Notif>{{a_name_, "after the refusal"}}));
    auto got = dst_->read_all();
    auto want = src_->read_all();
    EXPECT_TRUE(
        same_bytes(std::vector<uint8_t>(got.begin() + 4096, got.begin() + 4096 + (64 << 10)),
                   std::vector<uint8_t>(want.begin() + 4096, want.begin() + 4096 + (64 << 10))));
    EXPECT_TRUE(dst_->guards_intact());
}

class TargetGoesAway : public TwoAgents, public ::testing::WithParamInterface<nixl_xfer_op_t> {};

// a keeps transferring into b while b's agent is destroyed (it deregisters its memory, then its
// backend closes the connection). Every request succeeds until the first that fails, and that one
// fails with NIXL_ERR_REMOTE_DISCONNECT, never NIXL_ERR_NOT_FOUND for the refusals that race the
// close (those the deregistration causes). On it NIXL forgets b's metadata, as its own
// error-handling tests expect, so the next request cannot even be created. Several rounds, to
// give the race its chances.
TEST_P(TargetGoesAway, TransfersFailAsRemoteDisconnect) {
    constexpr size_t kSize = 1 << 20;
    for (int round = 0; round < 4; ++round) {
        SCOPED_TRACE("round " + std::to_string(round));
        start(kSize, {}, {},
              std::string("away-") + op_name(GetParam()) + "-" + std::to_string(round));
        std::atomic<bool> stop{false};
        std::thread killer([&] {
            std::this_thread::sleep_for(milliseconds(50 + 20 * round));
            b_.reset();
            stop = true;
        });
        int ok = 0;
        nixl_status_t last = NIXL_SUCCESS;
        const auto deadline = std::chrono::steady_clock::now() + kTimeout;
        while (last == NIXL_SUCCESS && std::chrono::steady_clock::now() < deadline) {
            const bool gone = stop.load();
            nixlXferReqH* req = nullptr;
            ASSERT_EQ((*a_)->createXferReq(GetParam(), xfer_list(*src_, {{0, 64 << 10}}),
                                           xfer_list(*dst_, {{0, 64 << 10}}), b_name_, req),
                      NIXL_SUCCESS);
            last = post_and_wait(*a_, req);
            EXPECT_EQ((*a_)->releaseXferReq(req), NIXL_SUCCESS);
            if (last == NIXL_SUCCESS) {
                EXPECT_FALSE(gone) << "a transfer succeeded after its target was destroyed";
                ++ok;
            }
        }
        killer.join();
        EXPECT_GT(ok, 0);
        EXPECT_EQ(last, NIXL_ERR_REMOTE_DISCONNECT) << nixlEnumStrings::statusStr(last);
        nixlXferReqH* req = nullptr;
        EXPECT_EQ((*a_)->createXferReq(GetParam(), xfer_list(*src_, {{0, 4096}}),
                                       xfer_list(*dst_, {{0, 4096}}), b_name_, req),
                  NIXL_ERR_NOT_FOUND);
        a_.reset();
    }
}

INSTANTIATE_TEST_SUITE_P(Op, TargetGoesAway, ::testing::Values(NIXL_WRITE, NIXL_READ),
                         [](const ::testing::TestParamInfo<nixl_xfer_op_t>& info) {
                             return op_name(info.param);
                         });

// --- 5c: a shared secret
// --------------------------------------------------------------------------

nixl_b_params_t with_secret(const std::string& secret) {
    nixl_b_params_t p = loopback_params();
    if (!secret.empty()) p["auth_secret"] = secret;
    return p;
}

// Agents with the same auth_secret move data; an initiator with another secret, or none, and a
// target without one, are refused with NIXL_ERR_NOT_ALLOWED and nothing reaches the target.
TEST(NixlAuth, SameSecretWorksWrongOrMissingIsRefused) {
    const std::string secret = "the prefill-decode secret, 2026";
    constexpr size_t kSize = 256 << 10;
    auto src = Buffer::create(DRAM_SEG, kSize);
    auto dst = Buffer::create(DRAM_SEG, kSize);
    ASSERT_TRUE(src && dst);
    src->fill(81);
    dst->fill(82);
    TestAgent target("auth-target", {.params = with_secret(secret)});
    ASSERT_TRUE(target.reg(*dst));
    const std::string target_md = target.metadata();

    struct Case {
        const char* name;
        std::string initiator_secret;
        nixl_status_t want;
    };
    const Case cases[] = {
        {"auth-wrong", "another secret of enough length", NIXL_ERR_NOT_ALLOWED},
        {"auth-none", "", NIXL_ERR_NOT_ALLOWED},
        {"auth-same", secret, NIXL_SUCCESS},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.name);
        if (c.want != NIXL_SUCCESS) dst->fill(82);
        const auto before = dst->read_all();
        TestAgent a(c.name, {.params = with_secret(c.initiator_secret)});
        ASSERT_TRUE(a.reg(*src));
        ASSERT_EQ(a.load(target_md), "auth-target");
        for (nixl_xfer_op_t op : {NIXL_WRITE, NIXL_READ}) {
            SCOPED_TRACE(op_name(op));
            const nixl_opt_args_t args = with_notif(c.name);
            nixlXferReqH* req = nullptr;
            ASSERT_EQ(a->createXferReq(op, xfer_list(*src, {{0, kSize}}),
                                       xfer_list(*dst, {{0, kSize}}), "auth-target", req, &args),
                      NIXL_SUCCESS);
            EXPECT_EQ(post_and_wait(a, req, {&target}), c.want);
            EXPECT_EQ(a->releaseXferReq(req), NIXL_SUCCESS);
        }
        pump_for(milliseconds(50), {&a, &target});
        if (c.want == NIXL_SUCCESS) {
            EXPECT_TRUE(same_bytes(dst->read_all(), src->read_all()));
            EXPECT_EQ(target.count({c.name, c.name}), 2u);
        } else {
            EXPECT_TRUE(same_bytes(dst->read_all(), before));
            EXPECT_EQ(target.count({c.name, c.name}), 0u);
        }
    }
    EXPECT_EQ(target.received().size(), 2u);

    // A target without a secret refuses an initiator that has one.
    TestAgent open_target("auth-open", {.params = with_secret("")});
    ASSERT_TRUE(open_target.reg(*dst));
    TestAgent a("auth-closed", {.params = with_secret(secret)});
    ASSERT_TRUE(a.reg(*src));
    ASSERT_EQ(a.load(open_target), "auth-open");
    nixlXferReqH* req = nullptr;
    ASSERT_EQ(a->createXferReq(NIXL_WRITE, xfer_list(*src, {{0, kSize}}),
                               xfer_list(*dst, {{0, kSize}}), "auth-open", req),
              NIXL_SUCCESS);
    EXPECT_EQ(post_and_wait(a, req, {&open_target}), NIXL_ERR_NOT_ALLOWED);
    EXPECT_EQ(a->releaseXferReq(req), NIXL_SUCCESS);

    // A secret too short to be one fails createBackend.
    nixlAgent agent("auth-short", nixlAgentConfig(true));
    nixlBackendH* backend = nullptr;
    EXPECT_NE(agent.createBackend(kBackend, with_secret("short"), backend), NIXL_SUCCESS);
}

// An inbound connection that claims the name of an agent that is connected is refused: the
// impostor's transfers fail and the real agent's go on. (A connection claiming the target's own
// name is refused the same way; NIXL's agent API cannot make one: it will not load metadata of
// an agent of its own name.)
TEST(NixlNames, AClaimedNameCannotTakeOverAConnectedAgent) {
    constexpr size_t kSize = 64 << 10;
    auto src = Buffer::create(DRAM_SEG, kSize);
    auto dst = Buffer::create(DRAM_SEG, kSize);
    ASSERT_TRUE(src && dst);
    src->fill(91);
    TestAgent target("names-target");
    ASSERT_TRUE(target.reg(*dst));
    const std::string md = target.metadata();

    auto write_from = [&](TestAgent& a) {
        nixlXferReqH* req = nullptr;
        const nixl_opt_args_t args = with_notif("from " + a.name());
        EXPECT_EQ(a->createXferReq(NIXL_WRITE, xfer_list(*src, {{0, kSize}}),
                                   xfer_list(*dst, {{0, kSize}}), "names-target", req, &args),
                  NIXL_SUCCESS);
        const nixl_status_t st = post_and_wait(a, req, {&target});
        EXPECT_EQ(a->releaseXferReq(req), NIXL_SUCCESS);
        return st;
    };

    TestAgent real("names-real");
    ASSERT_TRUE(real.reg(*src));
    ASSERT_EQ(real.load(md), "names-target");
    ASSERT_EQ(write_from(real), NIXL_SUCCESS);
    // The target learns who connected only when it looks (a genNotif, a getNotifs).
    ASSERT_TRUE(wait_notifs(target, 1, {&real}));

    {
        TestAgent impostor("names-real");
        ASSERT_TRUE(impostor.reg(*src));
        ASSERT_EQ(impostor.load(md), "names-target");
        // Its connection is served until the target's backend looks at who it is (its next
        // getNotifs): then it is closed, and what it posts fails.
        nixl_status_t st = NIXL_SUCCESS;
        const auto deadline = std::chrono::steady_clock::now() + kTimeout;
        while (st == NIXL_SUCCESS && std::chrono::steady_clock::now() < deadline) {
            st = write_from(impostor);
            target.pump();
        }
        EXPECT_EQ(st, NIXL_ERR_REMOTE_DISCONNECT) << nixlEnumStrings::statusStr(st);
    }
    // The target still answers the real agent, by its name.
    ASSERT_EQ(target.load(real.metadata()), "names-real");
    EXPECT_EQ(target->genNotif("names-real", "still you"), NIXL_SUCCESS);
    ASSERT_TRUE(wait_notifs(real, 1, {&target}));
    EXPECT_EQ(real.received(), (std::vector<Notif>{{"names-target", "still you"}}));
    EXPECT_EQ(write_from(real), NIXL_SUCCESS);
}

// An agent restarted under its name while its old connection still looks alive (its host went
// without closing it). With a shared secret the newcomer proved it is that agent: its connection
// replaces the old one (refused, as before, the new agent's writes had already succeeded, the
// engine serving a connection at once, and their notifications were dropped). Without one, its
// host proves nothing (any process there could claim the name and evict the agent at will): the
// connected agent keeps its place, even where the target holds its connection info.
TEST(NixlNames, AnAgentRestartedWhileItsOldConnectionLooksAliveReplacesItWithASecret) {
    constexpr size_t kSize = 4096;
    auto src = Buffer::create(DRAM_SEG, kSize);
    auto dst = Buffer::create(DRAM_SEG, kSize);
    ASSERT_TRUE(src && dst);
    const std::string secret = "a shared secret of enough length for the test";
    for (const bool with : {true, false}) {
        SCOPED_TRACE(with ? "with a secret" : "without");
        const std::string tname = with ? "restart-target-s" : "restart-target";
        const std::string aname = with ? "restart-agent-s" : "restart-agent";
        const AgentOptions opts{.params = with_secret(with ? secret : "")};
        TestAgent target(tname, opts);
        ASSERT_TRUE(target.reg(*dst));
        const std::string md = target.metadata();
        auto write_from = [&](TestAgent& a, const std::string& note) {
            nixlXferReqH* req = nullptr;
            const nixl_opt_args_t args = with_notif(note);
            EXPECT_EQ(a->createXferReq(NIXL_WRITE, xfer_list(*src, {{0, kSize}}),
                                       xfer_list(*dst, {{0, kSize}}), tname, req, &args),
                      NIXL_SUCCESS);
            const nixl_status_t st = post_and_wait(a, req, {&target});
            EXPECT_EQ(a->releaseXferReq(req), NIXL_SUCCESS);
            return st;
        };
        TestAgent old_one(aname, opts);
        ASSERT_TRUE(old_one.reg(*src));
        ASSERT_EQ(old_one.load(md), tname);
        ASSERT_EQ(write_from(old_one, "before"), NIXL_SUCCESS);
        ASSERT_TRUE(wait_notifs(target, 1, {&old_one}));
        ASSERT_EQ(target.load(old_one.metadata()), aname);  // where that agent is
        {
            TestAgent newcomer(aname, opts);
            ASSERT_TRUE(newcomer.reg(*src));
            ASSERT_EQ(newcomer.load(md), tname);
            if (with) {
                EXPECT_EQ(write_from(newcomer, "after the restart"), NIXL_SUCCESS);
                ASSERT_TRUE(wait_notifs(target, 2, {&newcomer}));
                EXPECT_EQ(write_from(newcomer, "and on"), NIXL_SUCCESS);
                ASSERT_TRUE(wait_notifs(target, 3, {&newcomer}));
            } else {
                // Served until the target looks at who it is, then closed.
                nixl_status_t st = NIXL_SUCCESS;
                const auto deadline = std::chrono::steady_clock::now() + kTimeout;
                while (st == NIXL_SUCCESS && std::chrono::steady_clock::now() < deadline) {
                    st = write_from(newcomer, "claimed");
                    target.pump();
                }
                EXPECT_EQ(st, NIXL_ERR_REMOTE_DISCONNECT) << nixlEnumStrings::statusStr(st);
            }
        }
        if (with) {
            EXPECT_EQ(target.received(),
                      (std::vector<Notif>{
                          {aname, "before"}, {aname, "after the restart"}, {aname, "and on"}}));
        } else {
            // The connected agent still writes, and its notifications alone arrive.
            EXPECT_EQ(write_from(old_one, "still here"), NIXL_SUCCESS);
            ASSERT_TRUE(wait_notifs(target, 2, {&old_one}));
            EXPECT_EQ(target.received(),
                      (std::vector<Notif>{{aname, "before"}, {aname, "still here"}}));
        }
    }
}

// What a refused connection sent before the target looked at who it is (the engine serves a
// connection, and queues its notifications, from the moment it is made) is not delivered: an
// impostor cannot tell the application, under a connected agent's name, that blocks are ready.
TEST(NixlNames, AnImpostorsNotificationsAreNotDelivered) {
    constexpr size_t kSize = 4096;
    auto src = Buffer::create(DRAM_SEG, kSize);
    auto dst = Buffer::create(DRAM_SEG, kSize);
    ASSERT_TRUE(src && dst);
    TestAgent target("forge-target");
    ASSERT_TRUE(target.reg(*dst));
    const std::string md = target.metadata();
    TestAgent real("forge-real");
    ASSERT_TRUE(real.reg(*src));
    ASSERT_EQ(real.load(md), "forge-target");
    ASSERT_EQ(real->genNotif("forge-target", "from the real one"), NIXL_SUCCESS);
    ASSERT_TRUE(wait_notifs(target, 1, {&real}));  // the target knows forge-real's connection
    {
        TestAgent impostor("forge-real");
        ASSERT_TRUE(impostor.reg(*src));
        ASSERT_EQ(impostor.load(md), "forge-target");
        // A notification on its own and a WRITE's, both in the target's engine before the
        // target's next getNotifs (its progress thread serves the impostor meanwhile).
        EXPECT_EQ(impostor->genNotif("forge-target", "forged standalone"), NIXL_SUCCESS);
        nixlXferReqH* req = nullptr;
        const nixl_opt_args_t args = with_notif("forged write");
        ASSERT_EQ(
            impostor->createXferReq(NIXL_WRITE, xfer_list(*src, {{0, kSize}}),
                                    xfer_list(*dst, {{0, kSize}}), "forge-target", req, &args),
            NIXL_SUCCESS);
        EXPECT_EQ(post_and_wait(impostor, req), NIXL_SUCCESS);  // the target not pumped
        EXPECT_EQ(impostor->releaseXferReq(req), NIXL_SUCCESS);
        // This getNotifs refuses (closes) the impostor's connection.
        pump_for(std::chrono::milliseconds(300), {&target});
    }
    // The real agent's notifications still arrive, under its name; the forged ones never did.
    ASSERT_EQ(real->genNotif("forge-target", "the real one again"), NIXL_SUCCESS);
    ASSERT_TRUE(wait_notifs(target, 2, {&real}));
    pump_for(std::chrono::milliseconds(100), {&target});
    EXPECT_EQ(target.received(), (std::vector<Notif>{{"forge-real", "from the real one"},
                                                     {"forge-real", "the real one again"}}));
}

// An initiator that went away gives back its place at the target: the target releases the
// connection once it sees it ended (in its getNotifs). Kept, every departed initiator would hold
// one of TCPX_P2P_MAX_PEERS for ever, and a target serving a stream of short-lived initiators
// would soon refuse them all.
TEST(NixlPeers, DepartedInitiatorsAreReleased) {
    constexpr size_t kSize = 4096;
    auto src = Buffer::create(DRAM_SEG, kSize);
    auto dst = Buffer::create(DRAM_SEG, kSize);
    ASSERT_TRUE(src && dst);
    AgentOptions topt;
    topt.params["MAX_PEERS"] = "3";
    TestAgent target("churn-target", topt);
    ASSERT_TRUE(target.reg(*dst));
    const std::string md = target.metadata();
    for (int i = 0; i < 8; ++i) {  // more than MAX_PEERS, one after another
        SCOPED_TRACE("initiator " + std::to_string(i));
        {
            TestAgent init("churn-init-" + std::to_string(i));
            ASSERT_TRUE(init.reg(*src));
            ASSERT_EQ(init.load(md), "churn-target");
            nixlXferReqH* req = nullptr;
            const nixl_opt_args_t args = with_notif("from " + init.name());
            ASSERT_EQ(
                init->createXferReq(NIXL_WRITE, xfer_list(*src, {{0, kSize}}),
                                    xfer_list(*dst, {{0, kSize}}), "churn-target", req, &args),
                NIXL_SUCCESS);
            ASSERT_EQ(post_and_wait(init, req, {&target}), NIXL_SUCCESS);
            EXPECT_EQ(init->releaseXferReq(req), NIXL_SUCCESS);
            ASSERT_TRUE(wait_notifs(target, i + 1, {&init}));
        }
        // The initiator is gone; the target polls as a target does.
        pump_for(std::chrono::milliseconds(300), {&target});
    }
    EXPECT_EQ(target.count({"churn-init-7", "from churn-init-7"}), 1u);
}

// --- 6: local transfers -------------------------------------------------------------------------

struct LocalParam {
    nixl_mem_t x_mem;
    nixl_mem_t y_mem;
    bool prog_thread;
};

std::string describe(const LocalParam& p) {
    return std::string(mem_name(p.x_mem)) + "And" + mem_name(p.y_mem) +
           (p.prog_thread ? "_Thread" : "_Polled");
}
void PrintTo(const LocalParam& p, std::ostream* os) { *os << describe(p); }

class LocalXfer : public ::testing::TestWithParam<LocalParam> {};

// An agent moving data between its own registrations: remote_agent is its own name (NIXL keeps
// its own registrations as a loopback "remote" section; no metadata is loaded).
TEST_P(LocalXfer, WriteAndReadWithNotification) {
    const LocalParam& p = GetParam();
    if ((p.x_mem == VRAM_SEG || p.y_mem == VRAM_SEG) && !have_gpu()) GTEST_SKIP() << "no GPU";
    const Layout l = make_layout(3, 16);
    auto x = Buffer::create(p.x_mem, l.local_size);
    auto y = Buffer::create(p.y_mem, l.remote_size);
    ASSERT_TRUE(x && y);
    TestAgent a("local-a", {.prog_thread = p.prog_thread});
    ASSERT_TRUE(a.reg(*x));
    ASSERT_TRUE(a.reg(*y, 0, l.remote_cut));
    ASSERT_TRUE(a.reg(*y, l.remote_cut, l.remote_size - l.remote_cut));
    for (nixl_xfer_op_t op : {NIXL_WRITE, NIXL_READ}) {
        SCOPED_TRACE(op_name(op));
        x->fill(op == NIXL_WRITE ? 31 : 33);
        y->fill(op == NIXL_WRITE ? 32 : 34);
        const auto x_before = x->read_all();
        const auto y_before = y->read_all();
        const std::string msg = std::string("local-") + op_name(op);
        const nixl_opt_args_t args = with_notif(msg);
        nixlXferReqH* req = nullptr;
        ASSERT_EQ(a->createXferReq(op, xfer_list(*x, l.local_ranges()),
                                   xfer_list(*y, l.remote_ranges()), "local-a", req, &args),
                  NIXL_SUCCESS);
        EXPECT_EQ(post_and_wait(a, req), NIXL_SUCCESS);
        EXPECT_EQ(a->releaseXferReq(req), NIXL_SUCCESS);
        if (op == NIXL_WRITE) {
            EXPECT_TRUE(same_bytes(y->read_all(), apply(y_before, x_before, l, true)));
            EXPECT_TRUE(same_bytes(x->read_all(), x_before));
        } else {
            EXPECT_TRUE(same_bytes(x->read_all(), apply(x_before, y_before, l, false)));
            EXPECT_TRUE(same_bytes(y->read_all(), y_before));
        }
        const size_t before = a.received().size();
        ASSERT_TRUE(wait_notifs(a, before + 1));
        EXPECT_EQ(a.received().back(), (Notif{"local-a", msg}));
    }
    EXPECT_EQ(a->genNotif("local-a", "to myself"), NIXL_SUCCESS);
    ASSERT_TRUE(wait_notifs(a, 3));
    pump_for(milliseconds(50), {&a});
    EXPECT_EQ(a.received(), (std::vector<Notif>{{"local-a", "local-Write"},
                                                {"local-a", "local-Read"},
                                                {"local-a", "to myself"}}));
    EXPECT_TRUE(x->guards_intact() && y->guards_intact());
}

INSTANTIATE_TEST_SUITE_P(
    Mem, LocalXfer,
    ::testing::Values(LocalParam{DRAM_SEG, DRAM_SEG, true}, LocalParam{DRAM_SEG, DRAM_SEG, false},
                      LocalParam{VRAM_SEG, VRAM_SEG, true}, LocalParam{DRAM_SEG, VRAM_SEG, true},
                      LocalParam{VRAM_SEG, DRAM_SEG, false}),
    [](const ::testing::TestParamInfo<LocalParam>& info) { return describe(info.param); });

// An agent destroyed with memory still registered (and a local transfer made through it): NIXL
// then deregisters the memory before it unloads the local "remote" metadata loadLocalMD gave, so
// that must be an object of its own (it once was the registration's, and unloading it read freed
// memory). Bare nixlAgent: TestAgent deregisters everything first.
TEST(NixlLifetime, AgentDestroyedWithMemoryStillRegistered) {
    for (const bool local_xfer : {false, true}) {
        SCOPED_TRACE(local_xfer ? "after a local transfer" : "registered only");
        auto buf = Buffer::create(DRAM_SEG, 1 << 20);
        ASSERT_TRUE(buf);
        buf->fill(7);
        {
            nixlAgent agent("lifetime", nixlAgentConfig(true));
            nixlBackendH* backend = nullptr;
            ASSERT_EQ(agent.createBackend(kBackend, loopback_params(), backend), NIXL_SUCCESS);
            nixl_reg_dlist_t regs(DRAM_SEG);
            regs.addDesc(nixlBlobDesc(buf->addr(), buf->size(), 0));
            ASSERT_EQ(agent.registerMem(regs), NIXL_SUCCESS);
            if (local_xfer) {
                const size_t half = buf->size() / 2;
                nixl_xfer_dlist_t src(DRAM_SEG), dst(DRAM_SEG);
                src.addDesc(nixlBasicDesc(buf->addr(), half, 0));
                dst.addDesc(nixlBasicDesc(buf->addr() + half, half, 0));
                nixlXferReqH* req = nullptr;
                ASSERT_EQ(agent.createXferReq(NIXL_WRITE, src, dst, "lifetime", req), NIXL_SUCCESS);
                nixl_status_t st = agent.postXferReq(req);
                for (int i = 0; st == NIXL_IN_PROG && i < 100000; ++i) {
                    st = agent.getXferStatus(req);
                }
                EXPECT_EQ(st, NIXL_SUCCESS);
                EXPECT_EQ(agent.releaseXferReq(req), NIXL_SUCCESS);
            }
        }  // destroyed here, the registration still in place
        EXPECT_TRUE(buf->guards_intact());
    }
}

// --- 10: backend parameters ---------------------------------------------------------------------

TEST(NixlParams, PluginAdvertisesItsParametersAndMemory) {
    nixlAgent agent("params-list", nixlAgentConfig(false));
    std::vector<nixl_backend_t> plugins;
    ASSERT_EQ(agent.getAvailPlugins(plugins), NIXL_SUCCESS);
    EXPECT_NE(std::find(plugins.begin(), plugins.end(), kBackend), plugins.end());
    nixl_mem_list_t mems;
    nixl_b_params_t params;
    ASSERT_EQ(agent.getPluginParams(kBackend, mems, params), NIXL_SUCCESS);
    EXPECT_NE(std::find(mems.begin(), mems.end(), DRAM_SEG), mems.end());
    EXPECT_NE(std::find(mems.begin(), mems.end(), VRAM_SEG), mems.end());
    for (const char* key : {"channels", "nsocks", "chunk_size", "interface", "auth_secret"}) {
        EXPECT_EQ(params.count(key), 1u) << key;
    }
    // The advertised defaults are the engine's as this machine runs them (the automatic socket
    // and channel counts resolved), as docs/nixl.md and configuration.md give them.
    const tcpx::Config here = tcpx::Config{}.effective();
    EXPECT_EQ(params["chunk_size"], "4194304");
    EXPECT_EQ(params["nsocks"], std::to_string(here.nsocks));
    EXPECT_EQ(params["channels"], std::to_string(here.channels));
    EXPECT_GE(here.nsocks, 2);
    EXPECT_EQ(params["gpu_index"], "-1");
    EXPECT_EQ(params["auth_secret"], "");

    // Created with exactly what it advertises (as applications do), it moves data.
    constexpr size_t kSize = (1 << 20) + 5;
    auto src = Buffer::create(DRAM_SEG, kSize);
    auto dst = Buffer::create(DRAM_SEG, kSize);
    ASSERT_TRUE(src && dst);
    src->fill(63);
    nixl_b_params_t as_advertised = params;
    as_advertised["interface"] = "=lo";
    TestAgent a("params-adv-a", {.params = as_advertised});
    TestAgent b("params-adv-b", {.params = as_advertised});
    ASSERT_TRUE(a.reg(*src));
    ASSERT_TRUE(b.reg(*dst));
    ASSERT_EQ(a.load(b), "params-adv-b");
    nixlXferReqH* req = nullptr;
    ASSERT_EQ(a->createXferReq(NIXL_WRITE, xfer_list(*src, {{0, kSize}}),
                               xfer_list(*dst, {{0, kSize}}), "params-adv-b", req),
              NIXL_SUCCESS);
    EXPECT_EQ(post_and_wait(a, req, {&b}), NIXL_SUCCESS);
    EXPECT_TRUE(same_bytes(dst->read_all(), src->read_all()));
    EXPECT_EQ(a->releaseXferReq(req), NIXL_SUCCESS);
}

// Valid parameters, by their backend names and by engine setting names, plus keys nobody knows:
// the backend is created and moves data.
TEST(NixlParams, ValidParametersWork) {
    const nixl_b_params_t params = {{"channels", "2"},      {"nsocks", "2"},
                                    {"chunk_size", "256K"}, {"interface", "=lo"},
                                    {"window", "8"},        {"no_such_parameter", "whatever"},
                                    {"net_plugin", ""}};
    constexpr size_t kSize = (3 << 20) + 17;
    auto src = Buffer::create(DRAM_SEG, kSize);
    auto dst = Buffer::create(DRAM_SEG, kSize);
    ASSERT_TRUE(src && dst);
    src->fill(61);
    TestAgent a("params-a", {.params = params});
    TestAgent b("params-b", {.params = params});
    ASSERT_NE(a.backend(), nullptr);
    nixl_mem_list_t mems;
    nixl_b_params_t got;
    ASSERT_EQ(a->getBackendParams(a.backend(), mems, got), NIXL_SUCCESS);
    EXPECT_EQ(got.at("chunk_size"), "256K");
    ASSERT_TRUE(a.reg(*src));
    ASSERT_TRUE(b.reg(*dst));
    ASSERT_EQ(a.load(b), "params-b");
    for (nixl_xfer_op_t op : {NIXL_WRITE, NIXL_READ}) {
        SCOPED_TRACE(op_name(op));
        if (op == NIXL_READ) dst->fill(62);
        nixlXferReqH* req = nullptr;
        ASSERT_EQ(a->createXferReq(op, xfer_list(*src, {{0, kSize}}), xfer_list(*dst, {{0, kSize}}),
                                   "params-b", req),
                  NIXL_SUCCESS);
        ASSERT_EQ(post_and_wait(a, req, {&b}), NIXL_SUCCESS);
        EXPECT_TRUE(same_bytes(src->read_all(), dst->read_all()));
        EXPECT_EQ(a->releaseXferReq(req), NIXL_SUCCESS);
    }
}

// An invalid value fails createBackend (no crash), and the agent can still create the backend
// with valid parameters afterwards.
TEST(NixlParams, InvalidValueFailsCreateBackend) {
    const std::vector<nixl_b_params_t> invalid = {
        {{"nsocks", "65"}},
        {{"nsocks", "abc"}},
        {{"nsocks", "-3"}},
        {{"channels", "999"}},
        {{"chunk_size", "1K"}},
        {{"chunk_size", "lots"}},
        {{"interface", "=no-such-interface0"}},
        {{"port", "70000"}},
        {{"log_level", "chatty"}},
    };
    nixlAgent agent("params-bad", nixlAgentConfig(true));
    for (const nixl_b_params_t& params : invalid) {
        SCOPED_TRACE(params.begin()->first + "=" + params.begin()->second);
        nixlBackendH* backend = nullptr;
        EXPECT_NE(agent.createBackend(kBackend, params, backend), NIXL_SUCCESS);
    }
    nixlBackendH* backend = nullptr;
    EXPECT_EQ(agent.createBackend(kBackend, loopback_params(), backend), NIXL_SUCCESS);
    EXPECT_NE(backend, nullptr);
}

// --- 11: many threads, one agent ----------------------------------------------------------------

class Threads : public ::testing::TestWithParam<bool> {};

// With NIXL_THREAD_SYNC_RW, threads create, post, check and release their own requests to the
// same remote agent at once; every byte is checked, every notification counted.
TEST_P(Threads, ConcurrentRequestsToOneAgent) {
    constexpr int kThreads = 4;
    constexpr int kIters = 24;
    constexpr size_t kSlice = 300 << 10;
    auto src = Buffer::create(DRAM_SEG, kThreads * kSlice);
    auto dst = Buffer::create(DRAM_SEG, kThreads * kSlice);
    ASSERT_TRUE(src && dst);
    const AgentOptions options{.prog_thread = GetParam(),
                               .sync = nixl_thread_sync_t::NIXL_THREAD_SYNC_RW};
    TestAgent a("threads-a", options);
    TestAgent b("threads-b", {.sync = nixl_thread_sync_t::NIXL_THREAD_SYNC_RW});
    ASSERT_TRUE(a.reg(*src));
    ASSERT_TRUE(b.reg(*dst));
    ASSERT_EQ(a.load(b), "threads-b");

    std::atomic<int> running{kThreads};
    auto work = [&](int t) {
        const uint64_t base = t * kSlice;
        std::mt19937_64 rng(t);
        for (int k = 0; k < kIters; ++k) {
            const nixl_xfer_op_t op = (k % 2 == 0) ? NIXL_WRITE : NIXL_READ;
            // A few descriptors of random sizes inside this thread's slice.
            Ranges ranges;
            uint64_t at = rng() % 64;
            for (int d = 0; d < 4; ++d) {
                const uint64_t len = 1 + rng() % (kSlice / 5);
                ranges.emplace_back(base + at, len);
                at += len + rng() % 100;
            }
            const uint64_t seed = 1000 * (t + 1) + k;
            Buffer& from = op == NIXL_WRITE ? *src : *dst;
            const auto bytes = make_pattern(kSlice, seed);
            from.write(base, bytes.data(), kSlice);
            const std::string msg = "t" + std::to_string(t) + "-" + std::to_string(k);
            const nixl_opt_args_t args = with_notif(msg);
            nixlXferReqH* req = nullptr;
            ASSERT_EQ(a->createXferReq(op, xfer_list(*src, ranges), xfer_list(*dst, ranges),
                                       "threads-b", req, &args),
                      NIXL_SUCCESS);
            nixl_status_t st = a->postXferReq(req);
            const auto deadline = std::chrono::steady_clock::now() + kTimeout;
            while (st == NIXL_IN_PROG && std::chrono::steady_clock::now() < deadline) {
                std::this_thread::yield();
                st = a->getXferStatus(req);
            }
            EXPECT_EQ(st, NIXL_SUCCESS) << msg;
            EXPECT_EQ(a->releaseXferReq(req), NIXL_SUCCESS);
            Buffer& to = op == NIXL_WRITE ? *dst : *src;
            for (const auto& [off, len] : ranges) {
                std::vector<uint8_t> got(len);
                to.read(off, got.data(), len);
                EXPECT_EQ(pattern_mismatch(got.data(), len, seed, off - base), kNoMismatch)
                    << msg << " [" << off << ", +" << len << ")";
            }
        }
    };
    auto worker = [&](int t) {
        work(t);  // returns early on a fatal failure
        --running;
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
    // The target is served from here meanwhile (a thread of its own, as an application would).
    while (running.load() > 0) {
        EXPECT_EQ(b.pump(), NIXL_SUCCESS);
        std::this_thread::sleep_for(milliseconds(1));
    }
    for (auto& th : threads) th.join();
    ASSERT_TRUE(wait_notifs(b, kThreads * kIters));
    pump_for(milliseconds(100), {&b});
    EXPECT_EQ(b.received().size(), static_cast<size_t>(kThreads * kIters));
    for (int t = 0; t < kThreads; ++t) {
        for (int k = 0; k < kIters; ++k) {
            const std::string msg = "t" + std::to_string(t) + "-" + std::to_string(k);
            EXPECT_EQ(b.count({"threads-a", msg}), 1u) << msg;
        }
    }
    EXPECT_TRUE(src->guards_intact() && dst->guards_intact());
}

INSTANTIATE_TEST_SUITE_P(InitiatorProgressThread, Threads, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                             return info.param ? "On" : "Off";
                         });

}  // namespace
}  // namespace tcpx::nixl_test
