// The engine between processes: a target in another process, and peers killed mid-transfer.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <thread>

#include "common/strings.h"
#include "tests/support/engine_child.h"
#include "tests/support/engine_test_util.h"
#include "tests/support/net_test_util.h"
#include "tests/support/subprocess.h"

#ifndef TCPX_ENGINE_PEER_PATH
#error "TCPX_ENGINE_PEER_PATH must point at the tcpx_engine_peer helper"
#endif

namespace tcpx::testing {
namespace {

using namespace std::chrono_literals;

TEST(EngineProcesses, WriteReadAndNotifyAcrossProcesses) {
    constexpr size_t kBytes = 64 << 20;
    ChildTarget target;
    ASSERT_TRUE(target.start(kBytes, false));
    auto ep = make_endpoint("initiator");
    ASSERT_NE(ep, nullptr);
    auto peer = ep->connect(target.metadata);
    ASSERT_TRUE(peer.ok()) << peer.status().to_string();
    GuardedBuffer buf(kBytes);
    MemId mem = *ep->reg(buf.data(), kBytes);
    // The target's region holds pattern 7: read it whole.
    auto r = ep->read(*peer, mem, 0, target.mem, 0, kBytes);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(ep->wait(*r, 30s).ok());
    EXPECT_EQ(find_pattern_mismatch(buf.data(), kBytes, 7), -1);
    // Write new data into its middle, with a notification; the target checks its memory.
    const uint64_t off = 5 << 20, len = 40 << 20;
    fill_pattern(buf.data(), len, 99);
    auto w = ep->write(*peer, mem, 0, target.mem, off, len, std::string_view("done\0!", 6));
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(ep->wait(*w, 30s).ok());
    std::string line;
    ASSERT_TRUE(target.proc.read_line(&line, 10s));
    EXPECT_EQ(line, "notif " + to_hex("done\0!", 6));
    // The target checks its own memory: the written range, and what surrounds it untouched.
    EXPECT_EQ(target.check(off, len, 99), "ok");
    // Outside the range the original pattern (seed 7, position-dependent) is intact.
    std::vector<uint8_t> original(kBytes);
    fill_pattern(original.data(), kBytes, 7);
    std::memset(buf.data(), 0, kBytes);
    auto r2 = ep->read(*peer, mem, 0, target.mem, 0, kBytes);
    ASSERT_TRUE(r2.ok());
    ASSERT_TRUE(ep->wait(*r2, 30s).ok());
    EXPECT_EQ(std::memcmp(buf.data(), original.data(), off), 0);
    EXPECT_EQ(std::memcmp(buf.data() + off + len, original.data() + off + len, kBytes - off - len),
              0);
    EXPECT_EQ(find_pattern_mismatch(buf.data() + off, len, 99), -1);
    EXPECT_TRUE(buf.canaries_intact());
}

TEST(EngineProcesses, TargetKilledMidWriteFailsOnlyItsTransfers) {
    constexpr size_t kBytes = 256 << 20;
    ChildTarget target;
    ASSERT_TRUE(target.start(kBytes, true));
    auto ep = make_endpoint("initiator");
    auto other = make_endpoint("bystander");
    ASSERT_TRUE(ep && other);
    auto peer = ep->connect(target.metadata);
    ASSERT_TRUE(peer.ok()) << peer.status().to_string();
    Link l = link(ep.get(), other.get());
    std::vector<uint8_t> src(kBytes, 0x11);
    MemId mem = *ep->reg(src.data(), kBytes);
    GuardedBuffer dst(4 << 20);
    MemId dmem = *other->reg(dst.data(), dst.size());
    RemoteMem ddesc = *other->describe(dmem);

    auto w = ep->write(*peer, mem, 0, target.mem, 0, kBytes);
    ASSERT_TRUE(w.ok());
    std::this_thread::sleep_for(100ms);
    target.proc.kill_now();
    const auto killed = std::chrono::steady_clock::now();
    Status st = ep->wait(*w, 20s);
    EXPECT_FALSE(st.ok()) << "the write completed although its target was killed";
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
    EXPECT_LT(std::chrono::steady_clock::now() - killed, 5s);
    // New transfers to the dead peer fail at once; the other peer carries on.
    EXPECT_FALSE(ep->write(*peer, mem, 0, target.mem, 0, 10).ok());
    fill_pattern(src.data(), 4 << 20, 3);
    auto ok = ep->write(l.a_to_b, mem, 0, ddesc, 0, 4 << 20);
    ASSERT_TRUE(ok.ok());
    EXPECT_TRUE(ep->wait(*ok, 20s).ok());
    EXPECT_EQ(find_pattern_mismatch(dst.data(), 4 << 20, 3), -1);
    // The source region is free at once: nothing in flight holds it.
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(ep->dereg(mem).ok());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
}

TEST(EngineProcesses, InitiatorKilledMidWriteReleasesTheTarget) {
    constexpr size_t kBytes = 16 << 20;
    auto target = make_endpoint("target");
    ASSERT_NE(target, nullptr);
    GuardedBuffer region(kBytes);
    MemId mem = *target->reg(region.data(), kBytes);
    const std::string md = target->metadata();
    const std::string desc = target->describe(mem)->serialize();
    Subprocess init;
    ASSERT_TRUE(init.start({TCPX_ENGINE_PEER_PATH, "initiator", to_hex(md.data(), md.size()),
                            to_hex(desc.data(), desc.size()), std::to_string(kBytes)},
                           engine_child_env(true)));
    expect_line(&init, "connected");
    auto peer = target->accept(10s);
    ASSERT_TRUE(peer.ok());
    std::string line;
    ASSERT_TRUE(init.read_line(&line, 30s));  // one whole write landed
    EXPECT_EQ(line, "wrote");
    init.kill_now();
    // The dead initiator's write in progress is abandoned; dereg returns promptly and, from
    // then on, nothing writes into the region.
    ASSERT_TRUE(eventually([&] { return !target->notify(*peer, "x").ok(); }, 5s));
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(target->dereg(mem).ok());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
    std::fill(region.data(), region.data() + kBytes, 0x5d);
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(std::count(region.data(), region.data() + kBytes, 0x5d), static_cast<long>(kBytes));
    EXPECT_TRUE(region.canaries_intact());
}

}  // namespace
}  // namespace tcpx::testing
