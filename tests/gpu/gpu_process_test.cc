// Two GPUs in two processes: this process's endpoint on GPU 0, a target in a child process on the
// last GPU (the same GPU on a one-GPU machine), over the socket net (staging) and the emulated TCPX
// plugin (unpack). Every byte verified on both sides.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "tests/support/engine_child.h"
#include "tests/support/engine_test_util.h"
#include "tests/support/net_test_util.h"
#include "tests/support/test_buffer.h"

namespace tcpx::testing {
namespace {

using namespace std::chrono_literals;

class GpuProcesses : public ::testing::TestWithParam<bool> {};  // true: the emulated TCPX

TEST_P(GpuProcesses, WriteAndReadBetweenGpusOfTwoProcesses) {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
    const int gpus = cuda::device_count();
    const bool plugin = GetParam();
    constexpr size_t kBytes = 64 << 20;
    std::map<std::string, std::string> env;
    Config config = engine_test_config();
    config.gpu_index = 0;
    if (plugin) {
        env["TCPX_P2P_NET_PLUGIN"] = TCPX_FAKE_TCPX_PATH;
        config.net_plugin = TCPX_FAKE_TCPX_PATH;
    }
    ChildTarget target;
    ASSERT_TRUE(target.start(kBytes, false, gpus - 1, env));
    EXPECT_EQ(target.mem.kind, MemKind::kCuda);
    EXPECT_EQ(target.mem.device, gpus - 1);
    auto ep = make_endpoint("initiator", config);
    ASSERT_NE(ep, nullptr);
    auto peer = ep->connect(target.metadata);
    ASSERT_TRUE(peer.ok()) << peer.status().to_string();
    auto buf = device_buffer(kBytes, 0, nullptr);
    ASSERT_NE(buf, nullptr);
    auto mem = ep->reg(buf->data(), kBytes);
    ASSERT_TRUE(mem.ok());

    // READ the whole region (pattern 7) into our GPU.
    auto r = ep->read(*peer, *mem, 0, target.mem, 0, kBytes);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(ep->wait(*r, 60s).ok());
    EXPECT_EQ(find_pattern_mismatch(buf->download(0, kBytes).data(), kBytes, 7), -1);

    // WRITE odd-sized pieces at odd offsets; the target checks its GPU memory.
    const uint64_t pieces[][2] = {
        {1, 1}, {4097, 8191}, {(5 << 20) + 3, (9 << 20) + 11}, {40 << 20, (20 << 20) - 1}};
    uint64_t seed = 100;
    for (const auto& piece : pieces) {
        const uint64_t off = piece[0], len = piece[1];
        std::vector<uint8_t> v(len);
        fill_pattern(v.data(), len, seed);
        buf->upload(off, v.data(), len);
        auto w = ep->write(*peer, *mem, off, target.mem, off, len);
        ASSERT_TRUE(w.ok());
        ASSERT_TRUE(ep->wait(*w, 60s).ok());
        EXPECT_EQ(target.check(off, len, seed), "ok") << "piece at " << off;
        ++seed;
    }
    EXPECT_TRUE(buf->canaries_intact());
    ep.reset();
}

INSTANTIATE_TEST_SUITE_P(Nets, GpuProcesses, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "FakeTcpx" : "SocketNet"; });

}  // namespace
}  // namespace tcpx::testing
