// Out of memory in the engine's own threads: an allocation that fails (std::bad_alloc, made to
// happen by AllocFault) in the progress thread or a socket I/O thread must end in errors for the
// transfers it touched, never in the process ending (an exception leaving a thread calls
// std::terminate) or a transfer that never ends; once memory is back, the endpoints move bytes
// again, byte for byte.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "engine/xfer_table.h"
#include "tcpx/tcpx.h"
#include "tests/support/alloc_fault.h"
#include "tests/support/engine_test_util.h"
#include "tests/support/log_capture.h"

namespace tcpx::testing {
namespace oom {  // the binary is one unity build: its own names

using namespace std::chrono_literals;

constexpr auto kBound = 20s;  // longer than this is a hang (PEER_TIMEOUT_MS is 2 s here)
constexpr uint64_t kRegion = 4 << 20;
constexpr uint64_t kLen = (1 << 20) + 4567;

void fill(uint8_t* p, uint64_t n, uint32_t seed) {
    for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>((i * 131 + seed * 7 + 1) >> 3);
}

namespace {

struct Side {
    std::unique_ptr<GuardedBuffer> buf;  // outlives the endpoint (declared first)
    std::unique_ptr<Endpoint> ep;
    MemId mem = 0;
};

class EngineOom : public ::testing::TestWithParam<const char*> {
 protected:
    Config config() const {
        Config c = engine_test_config();
        c.peer_timeout_ms = 2000;
        c.socket_io = GetParam();
        return c;
    }
    void SetUp() override {
        for (Side* s : {&a_, &b_}) {
            s->buf = std::make_unique<GuardedBuffer>(kRegion, 0x11);
            s->ep = make_endpoint(s == &a_ ? "initiator" : "target", config());
            ASSERT_NE(s->ep, nullptr);
            auto m = s->ep->reg(s->buf->data(), kRegion);
            ASSERT_TRUE(m.ok()) << m.status().to_string();
            s->mem = *m;
        }
        auto d = b_.ep->describe(b_.mem);
        ASSERT_TRUE(d.ok());
        bdesc_ = *d;
        relink();
    }
    void relink() {
        const Link l = link(a_.ep.get(), b_.ep.get());
        peer_ = l.a_to_b;
    }
    // One WRITE of kLen at `off` in both registrations; its status (never a hang).
    Status write_once(uint64_t off, uint32_t seed) {
        fill(a_.buf->data() + off, kLen, seed);
        auto id = a_.ep->write(peer_, a_.mem, off, bdesc_, off, kLen);
        if (!id.ok()) return id.status();
        const Status st = a_.ep->wait(*id, kBound);
        EXPECT_NE(st.code(), StatusCode::kTimeout) << "a transfer hung: " << st.to_string();
        return st;
    }
    // A WRITE once memory is back, on a fresh connection when the last one failed: every
    // byte lands.
    void expect_recovered(uint32_t seed) {
        if (!a_.ep->peer_status(peer_).ok()) relink();
        const uint64_t off = 777;
        const Status st = write_once(off, seed);
        ASSERT_TRUE(st.ok()) << st.to_string();
        ASSERT_EQ(std::memcmp(a_.buf->data() + off, b_.buf->data() + off, kLen), 0);
        EXPECT_TRUE(a_.buf->canaries_intact());
        EXPECT_TRUE(b_.buf->canaries_intact());
    }

    Side a_, b_;
    RemoteMem bdesc_;
    PeerId peer_ = 0;
};

// One allocation of the progress threads' fails, the 0th, 1st, ... after arming: whichever
// structure it was building, the transfer ends (done, or failed with the peer), and the next one
// is byte-exact.
TEST_P(EngineOom, AnAllocationFailingInTheProgressThreadEndsInErrorsNotTheProcess) {
    long failed = 0;
    int errors = 0;
    for (long skip : {0L, 1L, 2L, 3L, 5L, 8L, 13L, 21L, 34L, 55L, 89L, 144L}) {
        SCOPED_TRACE("skip " + std::to_string(skip));
        Status st;
        {
            test::AllocFault fault("tcpx-progress", skip, 1);
            st = write_once(0, static_cast<uint32_t>(skip));
            failed += fault.failed();
        }
        if (!st.ok()) {
            ++errors;
            EXPECT_TRUE(st.code() == StatusCode::kResourceExhausted ||
                        st.code() == StatusCode::kUnavailable)
                << st.to_string();
        }
        expect_recovered(static_cast<uint32_t>(skip) + 1000);
    }
    // The test means something only if the fault hit: the progress threads allocate while
    // transfers run.
    EXPECT_GT(failed, 0);
    EXPECT_GT(errors, 0);
}

// Every allocation of the progress threads in turn, for one WRITE each, and the endpoints
// closed at the end: no chunk operation is left counted (an op lost from every list by an
// exception part way through finishing it would keep the progress thread busy for good).
TEST_P(EngineOom, NoOperationIsLostToAnAllocationFailingInTheProgressThread) {
    LogCapture log(LogLevel::kWarn);
    long failed = 0;
    for (long skip = 0; skip < 120; ++skip) {
        SCOPED_TRACE("skip " + std::to_string(skip));
        {
            test::AllocFault fault("tcpx-progress", skip, 1);
            (void)write_once(0, static_cast<uint32_t>(skip));
            failed += fault.failed();
        }
        expect_recovered(static_cast<uint32_t>(skip) + 2000);
    }
    EXPECT_GT(failed, 0);
    a_.ep.reset();
    b_.ep.reset();
    EXPECT_FALSE(log.contains("still counted at close")) << log.all();
}

// The API's calls, on the caller's thread: a call whose allocation fails returns
// RESOURCE_EXHAUSTED (no exception leaves it, endpoint.h); one that returned an id has a
// transfer that ends.
TEST_P(EngineOom, AnApiCallOutOfMemoryReturnsResourceExhausted) {
    int refused = 0;
    for (long skip = 0; skip < 24; ++skip) {
        SCOPED_TRACE("allocation " + std::to_string(skip));
        StatusOr<XferId> id = Status();
        StatusOr<MemId> mem = Status();
        {
            test::AllocFault fault("", skip, 1);
            id = a_.ep->write(peer_, a_.mem, 0, bdesc_, 0, kLen, std::string_view("note"));
            mem = a_.ep->reg(a_.buf->data() + kLen, 4096);
        }
        for (const Status& st : {id.status(), mem.status()}) {
            if (!st.ok()) {
                ++refused;
                EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
            }
        }
        if (id.ok()) {
            const Status st = a_.ep->wait(*id, kBound);
            EXPECT_NE(st.code(), StatusCode::kTimeout) << st.to_string();
        }
        if (mem.ok()) {
            EXPECT_TRUE(a_.ep->dereg(*mem).ok());
        }
        (void)b_.ep->get_notifications();
        expect_recovered(static_cast<uint32_t>(skip) + 3000);
    }
    EXPECT_GT(refused, 0);  // the calls allocate: the fault hit
}

// A post whose allocation fails leaves no reference to the memory it named: dereg() returns at
// once (a reference taken for a piece that never made it into the transfer's list was never
// given back; dereg then waited out PEER_TIMEOUT_MS, 2 s here, and the region was never freed).
TEST_P(EngineOom, APostOutOfMemoryHoldsNoReferenceToItsMemory) {
    int refused = 0;
    for (long skip = 0; skip < 24; ++skip) {
        SCOPED_TRACE("allocation " + std::to_string(skip));
        auto mem = a_.ep->reg(a_.buf->data() + kLen, 8192);
        ASSERT_TRUE(mem.ok()) << mem.status().to_string();
        StatusOr<XferId> id = Status();
        {
            test::AllocFault fault("", skip, 1);
            id = a_.ep->write(peer_, *mem, 0, bdesc_, 0, 8192);
        }
        if (id.ok()) {
            const Status st = a_.ep->wait(*id, kBound);
            EXPECT_NE(st.code(), StatusCode::kTimeout) << st.to_string();
        } else {
            ++refused;
        }
        const auto t0 = std::chrono::steady_clock::now();
        EXPECT_TRUE(a_.ep->dereg(*mem).ok());
        EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms) << "dereg waited for a reference";
        expect_recovered(static_cast<uint32_t>(skip) + 4000);
    }
    EXPECT_GT(refused, 0);
}

INSTANTIATE_TEST_SUITE_P(SocketIo, EngineOom, ::testing::Values("threads", "caller"));

// The socket transport's I/O threads (with SOCKET_IO=caller there are none: the progress thread
// does the I/O, above): a failure there fails the connection's comm, and the transfer with it.
using EngineOomIoThreads = EngineOom;

TEST_P(EngineOomIoThreads, AnAllocationFailingInASocketThreadEndsInErrorsNotTheProcess) {
    long failed = 0;
    for (long skip : {0L, 1L, 2L, 4L, 8L, 16L}) {
        SCOPED_TRACE("skip " + std::to_string(skip));
        // Every other round on a fresh connection: first requests on new sockets.
        if (skip % 2 == 0) {
            (void)a_.ep->disconnect(peer_);
            relink();
        }
        Status st;
        {
            test::AllocFault fault("tcpx-io", skip, 3);
            st = write_once(0, static_cast<uint32_t>(skip));
            failed += fault.failed();
        }
        if (!st.ok()) {
            EXPECT_TRUE(st.code() == StatusCode::kResourceExhausted ||
                        st.code() == StatusCode::kUnavailable)
                << st.to_string();
        }
        expect_recovered(static_cast<uint32_t>(skip) + 2000);
    }
    EXPECT_GT(failed, 0);  // the I/O threads allocate (a comm's failure, a connection's first
                           // requests): the fault hit
}

INSTANTIATE_TEST_SUITE_P(SocketIo, EngineOomIoThreads, ::testing::Values("threads"));

// The transfer table allocates its slots a block of 1024 at a time, with the first transfer of
// each block: a block that cannot be allocated must leave the table as it was (the post fails
// RESOURCE_EXHAUSTED), not a slot counted whose memory does not exist (the next post crashed).
// The C API takes every notification the engine holds at once and returns them one at a time:
// an allocation that fails while it takes them loses none (each is returned exactly once).
TEST(CApiOom, NotificationsTakenWhileMemoryRunsOutAreNotLost) {
    tcpx_config_t* cfg = nullptr;
    ASSERT_EQ(tcpx_config_new(&cfg), TCPX_OK);
    ASSERT_EQ(tcpx_config_set(cfg, "SOCKET_IFNAME", "=lo"), TCPX_OK);
    ASSERT_EQ(tcpx_config_set(cfg, "SOCKET_FAMILY", "ipv4"), TCPX_OK);
    tcpx_endpoint_t* a = nullptr;
    tcpx_endpoint_t* b = nullptr;
    ASSERT_EQ(tcpx_endpoint_create(cfg, "c-sender", &a), TCPX_OK);
    ASSERT_EQ(tcpx_endpoint_create(cfg, "c-receiver", &b), TCPX_OK);
    tcpx_config_free(cfg);
    char md[1024];
    size_t md_len = sizeof(md);
    ASSERT_EQ(tcpx_endpoint_metadata(b, md, &md_len), TCPX_OK);
    uint64_t to_b = 0;
    ASSERT_EQ(tcpx_connect(a, md, md_len, &to_b), TCPX_OK);
    uint64_t to_a = 0;
    ASSERT_EQ(tcpx_accept(b, 5000, &to_a), TCPX_OK);
    constexpr int kNotes = 40;
    std::vector<int> seen(kNotes, 0);
    int got = 0;
    char name[64];
    char payload[64];
    const auto take = [&] {
        size_t len = sizeof(payload);
        const tcpx_status_t st = tcpx_get_notification(b, name, sizeof(name), payload, &len);
        if (st == TCPX_OK) {
            const int i = std::atoi(std::string(payload, len).c_str());
            if (i >= 0 && i < kNotes) ++seen[static_cast<size_t>(i)];
            ++got;
        }
        return st;
    };
    for (long skip = 0; skip < 40; ++skip) {
        for (int i = 0; i < kNotes; ++i) {
            const std::string note = std::to_string(i);
            ASSERT_EQ(tcpx_notify(a, to_b, note.data(), note.size()), TCPX_OK);
        }
        std::this_thread::sleep_for(50ms);  // (b's engine has them all)
        {
            test::AllocFault fault("", skip, 1);
            (void)take();
        }
        const auto deadline = std::chrono::steady_clock::now() + kBound;
        while (got < (skip + 1) * kNotes && std::chrono::steady_clock::now() < deadline) {
            if (take() == TCPX_ERR_NOT_FOUND) std::this_thread::sleep_for(1ms);
        }
        ASSERT_EQ(got, (skip + 1) * kNotes) << "notifications lost at skip " << skip;
        for (int i = 0; i < kNotes; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)], skip + 1) << i;
    }
    tcpx_endpoint_destroy(a);
    tcpx_endpoint_destroy(b);
}

TEST(XferTableOom, ABlockThatCannotBeAllocatedLeavesTheTableAsItWas) {
    engine::XferTable table(4096, 77);
    bool threw = false;
    {
        test::AllocFault fault("", 0, 1);
        try {
            (void)table.allocate();
        } catch (const std::bad_alloc&) {
            threw = true;
        }
    }
    ASSERT_TRUE(threw);
    EXPECT_EQ(table.in_use(), 0u);
    std::vector<XferId> ids;
    for (int i = 0; i < 1500; ++i) {  // past the first block
        auto id = table.allocate();
        ASSERT_TRUE(id.ok()) << id.status().to_string();
        ids.push_back(*id);
    }
    EXPECT_EQ(ids.front() >> 32, 77u);  // the first generation, as asked
    for (XferId id : ids) {
        table.finish(id, Status());
        EXPECT_EQ(table.take(id).state, XferState::kDone);
    }
    EXPECT_EQ(table.in_use(), 0u);
}

// Reporting a transfer (take) frees its slot onto the free list: that must not allocate, or an
// allocation that failed there lost the outcome and the slot (the list was a deque, which takes
// a new node every 64 entries).
TEST(XferTableOom, ReportingNeverAllocates) {
    engine::XferTable table(4096, 3);
    std::vector<XferId> ids;
    for (int i = 0; i < 700; ++i) ids.push_back(*table.allocate());
    for (XferId id : ids) table.finish(id, Status());
    {
        test::AllocFault fault("", 0, 1 << 20);
        for (XferId id : ids) EXPECT_EQ(table.take(id).state, XferState::kDone);
        EXPECT_EQ(fault.failed(), 0);
    }
    EXPECT_EQ(table.in_use(), 0u);
    for (int i = 0; i < 700; ++i) ASSERT_TRUE(table.allocate().ok());  // every slot came back
    EXPECT_LE(table.slots_made(), 700 + engine::XferTable::kReuseAfter);
}

}  // namespace

}  // namespace oom
}  // namespace tcpx::testing
