// The loader over plugins that export only a newer ncclNet table (v8 to v12, built from
// tests/fakes/versioned_net.cc over the socket transport): each is adapted to v7's shape, its
// properties converted, its calls given the arguments v7 lacks, its limits enforced, and data
// moves byte-exact through it, alone and under the engine. Also: v7 wins when exported beside a
// newer table, and a library with no usable table is refused naming what it has.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/log.h"
#include "net/plugin/plugin_loader.h"
#include "tests/fakes/versioned_net.h"
#include "tests/plugin/plugin_test_util.h"
#include "tests/support/engine_test_util.h"
#include "tests/support/net_test_util.h"
#include "tests/support/sanitizers.h"

#ifndef TCPX_TEST_NET_DIR
#error "TCPX_TEST_NET_DIR must name the folder of the libnccl-net-test*.so plugins"
#endif

namespace tcpx::testing {
namespace {

using namespace std::chrono_literals;
using net::MemHandle;
using net::Request;

StatusOr<std::unique_ptr<net::Net>> load_test_net(const std::string& stem) {
    set_socket_env(loopback_settings());
    auto settings = Settings::from_env();
    if (!settings.ok()) return settings.status();
    return net::load_net_plugin(test_net_path(stem), *settings);
}

class NewerTable : public ::testing::TestWithParam<int> {
 protected:
    void SetUp() override {
        auto loaded = load_test_net(stem());
        ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
        net_ = std::move(loaded).value();
    }
    int version() const { return GetParam(); }
    std::string stem() const { return "testv" + std::to_string(version()); }
    std::unique_ptr<net::Net> net_;
};

TEST_P(NewerTable, LoadsAndSaysWhichVersion) {
    EXPECT_EQ(net_->name(), "tcpx-test-net-v" + std::to_string(version()));
    EXPECT_EQ(net_->device_count(), 1);
    std::mutex mu;
    std::vector<std::string> lines;
    const LogLevel saved_level = log_level();
    set_log_level(LogLevel::kInfo);
    set_log_sink([&](LogLevel, const char*, int, std::string_view message) {
        std::lock_guard<std::mutex> lock(mu);
        lines.emplace_back(message);
    });
    auto again = load_test_net(stem());  // the library is kept; the table is wrapped anew
    set_log_sink(nullptr);
    set_log_level(saved_level);
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    const std::string want = "(ncclNet v" + std::to_string(version()) + ",";
    bool found = false;
    for (const std::string& line : lines) found = found || line.find(want) != std::string::npos;
    EXPECT_TRUE(found) << "no log line says " << want;
}

TEST_P(NewerTable, PropertiesAreConverted) {
    net::Properties p;
    ASSERT_TRUE(net_->get_properties(0, &p).ok());
    const int v = version();
    EXPECT_EQ(p.name, "lo");
    EXPECT_EQ(p.guid, test_net::kGuidBase + static_cast<uint64_t>(v));
    EXPECT_EQ(p.ptr_support, static_cast<int>(net::MemType::kHost));
    EXPECT_EQ(p.speed_mbps, test_net::kSpeedBase + v);
    EXPECT_EQ(p.port, v);
    EXPECT_FLOAT_EQ(p.latency_us, v / 2.0f);
    EXPECT_EQ(p.max_comms, test_net::kMaxCommsBase + v);
    EXPECT_EQ(p.max_recvs, 8);
    EXPECT_EQ(p.device_type, net::DeviceType::kHost);
    EXPECT_EQ(p.max_requests, 8);
    EXPECT_TRUE(p.reports_sizes);
    EXPECT_EQ(p.max_reg_size, 0u) << "regMr takes a size_t from v8 on: no limit";
    EXPECT_FALSE(net_->get_properties(1, &p).ok()) << "one device only";
}

// A device that needs iflush() after CUDA receives (v9's forceFlush) is used without CUDA
// pointers: the engine never flushes.
TEST_P(NewerTable, ForceFlushTakesCudaSupportAway) {
    const int cuda = static_cast<int>(net::MemType::kCuda);
    net::Properties p;
    setenv("TCPX_TEST_NET_CUDA", "1", 1);
    ASSERT_TRUE(net_->get_properties(0, &p).ok());
    EXPECT_NE(p.ptr_support & cuda, 0);
    setenv("TCPX_TEST_NET_CUDA", "flush", 1);
    ASSERT_TRUE(net_->get_properties(0, &p).ok());
    unsetenv("TCPX_TEST_NET_CUDA");
    if (version() >= 9) {
        EXPECT_EQ(p.ptr_support & cuda, 0);
    } else {
        EXPECT_NE(p.ptr_support & cuda, 0) << "v8 has no forceFlush";
    }
    EXPECT_NE(p.ptr_support & static_cast<int>(net::MemType::kHost), 0);
}

TEST_P(NewerTable, TransfersAreByteExact) {
    CommPair pair = connect_pair(net_.get());
    ASSERT_NE(pair.send, nullptr);
    ASSERT_NE(pair.recv, nullptr);
    // Several sizes at once, all in flight together (6 < the 8 requests a comm takes).
    // The last one cut in many chunks: 40 MiB, 8 MiB under a sanitizer.
    const std::vector<size_t> sizes = {0,
                                       1,
                                       4095,
                                       (64 << 10) + 3,
                                       (1 << 20) + 7,
                                       testing::unless_sanitized<size_t>(40 << 20, 8 << 20)};
    std::vector<size_t> offsets;
    size_t total = 0;
    for (size_t s : sizes) {
        offsets.push_back(total);
        total += s;
    }
    std::vector<uint8_t> src(total), dst(total, 0xee);
    for (size_t i = 0; i < sizes.size(); ++i) fill_pattern(src.data() + offsets[i], sizes[i], i);
    MemHandle* smr = nullptr;
    MemHandle* rmr = nullptr;
    ASSERT_TRUE(net_->reg_mr(pair.send, src.data(), total, net::MemType::kHost, &smr).ok());
    ASSERT_TRUE(net_->reg_mr(pair.recv, dst.data(), total, net::MemType::kHost, &rmr).ok());

    std::vector<Request*> recvs, sends;
    for (size_t i = 0; i < sizes.size(); ++i) {
        void* d = dst.data() + offsets[i];
        size_t n = sizes[i];
        int tag = 0;
        Request* r = nullptr;
        ASSERT_TRUE(net_->irecv(pair.recv, 1, &d, &n, &tag, &rmr, &r).ok());
        ASSERT_NE(r, nullptr) << i;
        recvs.push_back(r);
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
        Request* r = nullptr;
        ASSERT_TRUE(net_->isend(pair.send, src.data() + offsets[i], sizes[i], 0, smr, &r).ok());
        ASSERT_NE(r, nullptr) << i;
        sends.push_back(r);
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
        size_t sent = 12345;
        size_t got = 12345;
        ASSERT_TRUE(wait_request(net_.get(), sends[i], &sent).ok()) << i;
        ASSERT_TRUE(wait_request(net_.get(), recvs[i], &got).ok()) << i;
        EXPECT_EQ(sent, sizes[i]);
        EXPECT_EQ(got, sizes[i]);
        ASSERT_TRUE(net_->irecv_consumed(pair.recv, 1, recvs[i]).ok());
        EXPECT_EQ(find_pattern_mismatch(dst.data() + offsets[i], sizes[i], i), -1) << i;
    }

    // One receive of three buffers takes the next three sends, each into its tag's buffer.
    std::fill(dst.begin(), dst.end(), 0xee);
    void* bufs[3] = {dst.data(), dst.data() + 1000, dst.data() + 3000};
    size_t buf_sizes[3] = {1000, 2000, 4000};
    int tags[3] = {1, 2, 3};
    MemHandle* mhs[3] = {rmr, rmr, rmr};
    Request* multi = nullptr;
    ASSERT_TRUE(net_->irecv(pair.recv, 3, bufs, buf_sizes, tags, mhs, &multi).ok());
    ASSERT_NE(multi, nullptr);
    const int send_tags[3] = {3, 1, 2};
    const size_t send_sizes[3] = {3333, 999, 0};
    for (int i = 0; i < 3; ++i) {
        fill_pattern(src.data() + i * 4096, send_sizes[i], 100 + i);
        Request* r = nullptr;
        ASSERT_TRUE(
            post_send(net_.get(), pair.send, src.data() + i * 4096, send_sizes[i], send_tags[i], &r)
                .ok());
        ASSERT_TRUE(wait_request(net_.get(), r).ok());
    }
    size_t got[8] = {};
    ASSERT_TRUE(wait_request(net_.get(), multi, got).ok());
    EXPECT_EQ(got[0], 999u);
    EXPECT_EQ(got[1], 0u);
    EXPECT_EQ(got[2], 3333u);
    ASSERT_TRUE(net_->irecv_consumed(pair.recv, 3, multi).ok());
    EXPECT_EQ(find_pattern_mismatch(bufs[0], 999, 101), -1);
    EXPECT_EQ(find_pattern_mismatch(bufs[2], 3333, 100), -1);
    EXPECT_EQ(dst[3000 + 3333], 0xee) << "nothing past the sent bytes";

    EXPECT_TRUE(net_->dereg_mr(pair.send, smr).ok());
    EXPECT_TRUE(net_->dereg_mr(pair.recv, rmr).ok());
    close_pair(net_.get(), pair);
}

// One call's limit: below 2 GiB through v8 (int sizes); from v9 the device's maxP2pBytes. regMr
// takes size_t from v8 on, so there the plugin itself refuses what it cannot take.
TEST_P(NewerTable, OversizedCallsAreRefused) {
    CommPair pair = connect_pair(net_.get());
    ASSERT_NE(pair.send, nullptr);
    ASSERT_NE(pair.recv, nullptr);
    const size_t limit = version() >= 9 ? test_net::kMaxP2pBytes : static_cast<size_t>(INT_MAX);
    uint8_t byte = 0;
    Request* r = nullptr;
    Status st = net_->isend(pair.send, &byte, limit + 1, 0, nullptr, &r);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("ncclNet v" + std::to_string(version())), std::string::npos)
        << st.to_string();
    EXPECT_EQ(r, nullptr);
    void* d = &byte;
    size_t n = limit + 1;
    int tag = 0;
    st = net_->irecv(pair.recv, 1, &d, &n, &tag, nullptr, &r);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(r, nullptr);
    MemHandle* mh = nullptr;
    st = net_->reg_mr(pair.send, &byte, size_t{INT_MAX} + 1, net::MemType::kHost, &mh);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    // Still usable.
    uint8_t in = 0;
    Request* rr = nullptr;
    Request* sr = nullptr;
    byte = 0x5a;
    ASSERT_TRUE(post_recv(net_.get(), pair.recv, &in, 1, 0, &rr).ok());
    ASSERT_TRUE(post_send(net_.get(), pair.send, &byte, 1, 0, &sr).ok());
    ASSERT_TRUE(wait_request(net_.get(), sr).ok());
    ASSERT_TRUE(wait_request(net_.get(), rr).ok());
    EXPECT_EQ(in, 0x5a);
    ASSERT_TRUE(net_->irecv_consumed(pair.recv, 1, rr).ok());
    close_pair(net_.get(), pair);
}

// The engine checks every handle a peer sends before connect(); these tables are shims over the
// socket transport, so their handles have its layout, which the setting names (their table names
// are their own). Without it, and without a shared secret, a peer's handles cannot be checked and
// the engine refuses to use them.
TEST_P(NewerTable, TheEngineRefusesHandlesItCannotCheck) {
    Config c = engine_test_config();
    c.net_plugin = test_net_path(stem());
    auto a = make_endpoint("a", c);
    auto b = make_endpoint("b", c);
    ASSERT_TRUE(a && b);
    auto id = a->connect(b->metadata());
    EXPECT_FALSE(id.ok());
    EXPECT_FALSE(b->accept(std::chrono::milliseconds(200)).ok());
}

TEST_P(NewerTable, TheEngineRunsOverIt) {
    Config c = engine_test_config();
    c.net_plugin = test_net_path(stem());
    c.plugin_handle_layout = "socket";
    auto a = make_endpoint("a", c);
    auto b = make_endpoint("b", c);
    ASSERT_TRUE(a && b);
    Link l = link(a.get(), b.get());
    ASSERT_NE(l.a_to_b, 0u);
    constexpr size_t kSize = 6 << 20;
    GuardedBuffer abuf(kSize), bbuf(kSize);
    MemId am = *a->reg(abuf.data(), kSize);
    MemId bm = *b->reg(bbuf.data(), kSize);
    fill_pattern(abuf.data(), kSize, 7);
    auto w = a->write(l.a_to_b, am, 0, *b->describe(bm), 0, kSize);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    ASSERT_TRUE(a->wait(*w, 30s).ok());
    EXPECT_EQ(find_pattern_mismatch(bbuf.data(), kSize, 7), -1);
    std::memset(abuf.data(), 0, kSize);
    auto r = a->read(l.a_to_b, am, 0, *b->describe(bm), 0, kSize);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_TRUE(a->wait(*r, 30s).ok());
    EXPECT_EQ(find_pattern_mismatch(abuf.data(), kSize, 7), -1);
    EXPECT_TRUE(abuf.canaries_intact() && bbuf.canaries_intact());
    ASSERT_TRUE(a->dereg(am).ok());
    ASSERT_TRUE(b->dereg(bm).ok());
}

// v8 to v12; under ThreadSanitizer the oldest and the newest only: the versions differ in their
// tables' shapes, which the other builds check, not in their threads.
const std::vector<int> kVersions =
    testing::kUnderThreadSanitizer ? std::vector<int>{8, 12} : std::vector<int>{8, 9, 10, 11, 12};

// An environment variable set for one scope.
struct ScopedEnv {
    ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
    ~ScopedEnv() { unsetenv(name_); }
    const char* name_;
};

// ncclInProgress from test() is no error and no end: NCCL reads `done` after it as after
// ncclSuccess. The loader took it for a failed request: done at once, released (the plugin still
// sending from the buffer; a receive reported empty).
TEST_P(NewerTable, InProgressFromTestIsNeitherAnErrorNorAnEnd) {
    ScopedEnv in_progress("TCPX_TEST_NET_IN_PROGRESS", "1");
    CommPair pair = connect_pair(net_.get());
    ASSERT_NE(pair.send, nullptr);
    ASSERT_NE(pair.recv, nullptr);
    const std::vector<size_t> sizes = {4095, (1 << 20) + 7};
    for (size_t i = 0; i < sizes.size(); ++i) {
        const size_t n = sizes[i];
        std::vector<uint8_t> src(n), dst(n + 1, 0xee);
        fill_pattern(src.data(), n, i);
        MemHandle* smr = nullptr;
        MemHandle* rmr = nullptr;
        ASSERT_TRUE(net_->reg_mr(pair.send, src.data(), n, net::MemType::kHost, &smr).ok());
        ASSERT_TRUE(net_->reg_mr(pair.recv, dst.data(), n, net::MemType::kHost, &rmr).ok());
        void* d = dst.data();
        size_t cap = n;
        int tag = 0;
        Request* r = nullptr;
        Request* s = nullptr;
        ASSERT_TRUE(net_->irecv(pair.recv, 1, &d, &cap, &tag, &rmr, &r).ok());
        ASSERT_TRUE(net_->isend(pair.send, src.data(), n, 0, smr, &s).ok());
        ASSERT_NE(r, nullptr);
        ASSERT_NE(s, nullptr);
        size_t sent = 0;
        size_t got = 0;
        ASSERT_TRUE(wait_request(net_.get(), s, &sent).ok()) << i;
        ASSERT_TRUE(wait_request(net_.get(), r, &got).ok()) << i;
        EXPECT_EQ(sent, n);
        EXPECT_EQ(got, n) << "a receive seen done before its bytes arrived";
        ASSERT_TRUE(net_->irecv_consumed(pair.recv, 1, r).ok());
        EXPECT_EQ(find_pattern_mismatch(dst.data(), n, i), -1) << i;
        EXPECT_EQ(dst[n], 0xee);
        EXPECT_TRUE(net_->dereg_mr(pair.send, smr).ok());
        EXPECT_TRUE(net_->dereg_mr(pair.recv, rmr).ok());
    }
    close_pair(net_.get(), pair);
}

INSTANTIATE_TEST_SUITE_P(Versions, NewerTable, ::testing::ValuesIn(kVersions),
                         [](const ::testing::TestParamInfo<int>& param) {
                             return "v" + std::to_string(param.param);
                         });

TEST(PluginVersions, V7IsPreferredWhenAlsoExported) {
    auto net = load_test_net("testv7v8");
    ASSERT_TRUE(net.ok()) << net.status().to_string();
    EXPECT_EQ((*net)->name(), "tcpx-test-net-v7");
    net::Properties p;
    ASSERT_TRUE((*net)->get_properties(0, &p).ok());
    EXPECT_NE(p.speed_mbps, test_net::kSpeedBase + 8) << "the v8 table's properties";
    // v7's regMr takes an int size: registrations in whole pages below 2 GiB.
    EXPECT_EQ(p.max_reg_size, (uint64_t{1} << 31) - 4096);
}

// A device count no machine has is a broken plugin: refused at once, not walked (each device's
// properties are read for its limits; 2^31 calls).
TEST(PluginVersions, AnImpossibleDeviceCountIsRefused) {
    ScopedEnv devices("TCPX_TEST_NET_DEVICES", "2147483647");
    auto net = load_test_net("testv9");
    ASSERT_FALSE(net.ok());
    EXPECT_NE(net.status().message().find("reports 2147483647 network devices"), std::string::npos)
        << net.status().to_string();
}

TEST(PluginVersions, NoUsableTableIsRefusedNamingWhatItHas) {
    auto net = load_test_net("testnone");
    ASSERT_FALSE(net.ok());
    EXPECT_EQ(net.status().code(), StatusCode::kUnimplemented);
    const std::string msg(net.status().message());
    EXPECT_NE(msg.find("ncclNetPlugin_v7 to ncclNetPlugin_v12"), std::string::npos) << msg;
    EXPECT_NE(msg.find("exports ncclNetPlugin_v6, ncclNetPlugin_v13"), std::string::npos) << msg;
    auto settings = Settings::from_env();
    ASSERT_TRUE(settings.ok());
    auto libc = net::load_net_plugin("libc.so.6", *settings);
    ASSERT_FALSE(libc.ok());
    EXPECT_NE(libc.status().message().find("it exports none"), std::string::npos)
        << libc.status().to_string();
}

}  // namespace
}  // namespace tcpx::testing
