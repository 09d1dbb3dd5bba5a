// The engine between processes: a target in another process, and peers killed mid-transfer.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <map>
#include <string>
#include <thread>

#include "common/socket.h"
#include "common/strings.h"
#include "engine/metadata.h"
#include "tests/support/engine_child.h"
#include "tests/support/engine_test_util.h"
#include "tests/support/net_test_util.h"
#include "tests/support/subprocess.h"
#include "tests/support/test_buffer.h"

#ifndef TCPX_ENGINE_PEER_PATH
#error "TCPX_ENGINE_PEER_PATH must point at the tcpx_engine_peer helper"
#endif

namespace tcpx::testing {
namespace {

using namespace std::chrono_literals;

// For targets that are killed or stopped mid-transfer and never read back: their region stays
// zero, and the test's source is a LazyBuffer, so neither side spends seconds filling 256 MiB
// that the transfer never reaches.
const std::map<std::string, std::string> kUnfilled = {{"TCPX_TEST_TARGET_UNFILLED", "1"}};

// The endpoint serves a peer in this process: connect, write 1 MiB, every byte checked.
void expect_serves_a_peer(Endpoint* ep) {
    auto peer = make_endpoint("checker");
    ASSERT_NE(peer, nullptr);
    auto id = peer->connect(ep->metadata());
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    GuardedBuffer src(1 << 20), dst(1 << 20);
    fill_pattern(src.data(), src.size(), 11);
    MemId s = *peer->reg(src.data(), src.size());
    RemoteMem d = *ep->describe(*ep->reg(dst.data(), dst.size()));
    auto w = peer->write(*id, s, 0, d, 0, src.size());
    ASSERT_TRUE(w.ok());
    EXPECT_TRUE(peer->wait(*w, 20s).ok());
    EXPECT_EQ(find_pattern_mismatch(dst.data(), dst.size(), 11), -1);
}

// The socket budget (MAX_SOCKETS) of a target in its own process, held by strangers that
// prove nothing and come back as soon as they are closed (100 silent connections, each
// replaced when closed, for 40 sockets): a real peer connecting meanwhile takes the place of the
// oldest, its data channels find theirs (the target's listener leaves a peer's channels their
// room), and its transfers are byte-exact. Without that room, strangers coming back took every
// place the channels' connects needed, and the peer failed at its deadline.
TEST(EngineProcesses, ARealPeerGetsThroughATargetWhoseSocketBudgetStrangersHold) {
    ChildTarget target;
    ASSERT_TRUE(target.start(1 << 20, false, -1,
                             {{"TCPX_P2P_MAX_SOCKETS", "40"},
                              {"TCPX_P2P_HANDSHAKE_TIMEOUT_MS", "60000"},
                              {"TCPX_P2P_MAX_HANDSHAKES", "2048"}}));
    const SocketAddress to = engine::decode_metadata(target.metadata).value().address;
    auto stranger = [&] {
        Fd fd(::socket(to.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
        if (fd.valid() && ::connect(fd.get(), to.get(), to.size()) != 0 && errno != EINPROGRESS) {
            fd.reset();
        }
        return fd;
    };
    auto closed = [](const Fd& fd) {
        char c;
        const ssize_t r = ::recv(fd.get(), &c, 1, MSG_DONTWAIT | MSG_PEEK);
        return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    };
    std::vector<Fd> strangers;
    for (int i = 0; i < 100; ++i) {
        strangers.push_back(stranger());
        ASSERT_TRUE(strangers.back().valid());
    }
    std::atomic<bool> stop{false};
    std::atomic<int> replaced{0};
    std::thread flood([&] {
        while (!stop.load()) {
            for (Fd& fd : strangers) {
                if (closed(fd)) {
                    fd = stranger();
                    replaced.fetch_add(1);
                }
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    });
    struct Joiner {  // (a failed ASSERT returns with the flood still running)
        std::atomic<bool>* stop;
        std::thread* thread;
        ~Joiner() {
            *stop = true;
            if (thread->joinable()) thread->join();
        }
    } joiner{&stop, &flood};
    // The target takes them off its queue, closing the oldest for each newcomer.
    EXPECT_TRUE(eventually([&] { return replaced.load() >= 100; }, 10s)) << replaced.load();
    auto ep = make_endpoint("initiator");
    ASSERT_NE(ep, nullptr);
    const int replaced_before = replaced.load();
    auto id = ep->connect(target.metadata);
    const int replaced_during = replaced.load() - replaced_before;
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    GuardedBuffer src(1 << 20), back(1 << 20);
    fill_pattern(src.data(), src.size(), 23);
    MemId s = *ep->reg(src.data(), src.size());
    MemId b = *ep->reg(back.data(), back.size());
    // With a notification: the target's main thread takes it before it checks its memory (an
    // order inside the target, which ThreadSanitizer sees; the one through this process it
    // would not).
    auto w = ep->write(*id, s, 0, target.mem, 0, src.size(), std::string_view("in", 2));
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    ASSERT_TRUE(ep->wait(*w, 20s).ok());
    std::string line;
    ASSERT_TRUE(target.proc.read_line(&line, 10s));
    EXPECT_EQ(line, "notif " + to_hex("in", 2));
    EXPECT_EQ(target.check(0, src.size(), 23), "ok");
    auto r = ep->read(*id, b, 0, target.mem, 0, back.size());
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_TRUE(ep->wait(*r, 20s).ok());
    EXPECT_EQ(find_pattern_mismatch(back.data(), back.size(), 23), -1);
    EXPECT_TRUE(src.canaries_intact() && back.canaries_intact());
    EXPECT_GT(replaced_during, 0) << "the flood had stopped while the peer connected";
}

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
    ASSERT_TRUE(target.start(kBytes, true, -1, kUnfilled));
    auto ep = make_endpoint("initiator");
    auto other = make_endpoint("bystander");
    ASSERT_TRUE(ep && other);
    auto peer = ep->connect(target.metadata);
    ASSERT_TRUE(peer.ok()) << peer.status().to_string();
    Link l = link(ep.get(), other.get());
    LazyBuffer src(kBytes);
    ASSERT_NE(src.data(), nullptr);
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

TEST(EngineProcesses, StoppedTargetFailsItsTransfersAfterThePeerTimeout) {
    // SIGSTOP: the socket stays open and the kernel keeps acknowledging, so only the peer
    // timeout (PEER_TIMEOUT_MS; default 30 s, 5 s here) can tell. The stopped target's transfers
    // fail then; another peer is unaffected.
    constexpr size_t kBytes = 256 << 20;
    ChildTarget target;
    ASSERT_TRUE(target.start(kBytes, true, -1, kUnfilled));
    Config c = engine_test_config();
    ASSERT_EQ(c.peer_timeout_ms, 5000);
    auto ep = make_endpoint("initiator", c);
    auto other = make_endpoint("bystander");
    ASSERT_TRUE(ep && other);
    auto peer = ep->connect(target.metadata);
    ASSERT_TRUE(peer.ok()) << peer.status().to_string();
    Link l = link(ep.get(), other.get());
    LazyBuffer src(kBytes);
    ASSERT_NE(src.data(), nullptr);
    MemId mem = *ep->reg(src.data(), kBytes);
    auto w = ep->write(*peer, mem, 0, target.mem, 0, kBytes);
    ASSERT_TRUE(w.ok());
    std::this_thread::sleep_for(100ms);
    ASSERT_TRUE(target.proc.stop(10s));
    const auto stopped = std::chrono::steady_clock::now();
    Status st = ep->wait(*w, 30s);
    const auto took = std::chrono::steady_clock::now() - stopped;
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.to_string();
    // The timeout runs from the peer's last word, which may precede the stop by a heartbeat
    // interval (a quarter of the timeout, 1.25 s) and a busy machine's scheduling delay: not an
    // immediate failure, and not long after the timeout either.
    EXPECT_GE(took, 3s);
    EXPECT_LT(took, 15s);
    GuardedBuffer dst(1 << 20);
    RemoteMem ddesc = *other->describe(*other->reg(dst.data(), dst.size()));
    fill_pattern(src.data(), 1 << 20, 5);
    auto ok = ep->write(l.a_to_b, mem, 0, ddesc, 0, 1 << 20);
    ASSERT_TRUE(ok.ok());
    EXPECT_TRUE(ep->wait(*ok, 20s).ok());
    EXPECT_EQ(find_pattern_mismatch(dst.data(), 1 << 20, 5), -1);
    ::kill(target.proc.pid(), SIGCONT);
    target.proc.kill_now();
}

TEST(EngineProcesses, TargetKilledDuringConnectFailsTheConnectPromptly) {
    ChildTarget target;
    ASSERT_TRUE(target.start(1 << 20, false));
    // Every thread of it stopped, not only the signal sent: under load its progress thread ran on
    // and finished the handshake before the stop took it (a flake, 1 run in 10 with the CPUs
    // busy).
    ASSERT_TRUE(target.proc.stop(10s));  // the handshake cannot finish
    Config c = engine_test_config();
    c.connect_timeout_ms = 60000;
    auto ep = make_endpoint("initiator", c);
    ASSERT_NE(ep, nullptr);
    std::thread killer([&] {
        std::this_thread::sleep_for(300ms);
        target.proc.kill_now();
    });
    const auto t0 = std::chrono::steady_clock::now();
    auto peer = ep->connect(target.metadata);
    killer.join();
    EXPECT_FALSE(peer.ok());
    EXPECT_EQ(peer.status().code(), StatusCode::kUnavailable) << peer.status().to_string();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
    expect_serves_a_peer(ep.get());
}

TEST(EngineProcesses, InitiatorKilledDuringTheHandshakeLeavesTheTargetClean) {
    auto target = make_endpoint("target");
    ASSERT_NE(target, nullptr);
    GuardedBuffer region(1 << 20);
    MemId mem = *target->reg(region.data(), region.size());
    const std::string md = target->metadata();
    const std::string desc = target->describe(mem)->serialize();
    expect_serves_a_peer(target.get());
    const int fds_before = count_open_fds();
    for (int delay_ms : {0, 2, 5, 10, 20}) {
        Subprocess init;
        ASSERT_TRUE(init.start({TCPX_ENGINE_PEER_PATH, "initiator", to_hex(md.data(), md.size()),
                                to_hex(desc.data(), desc.size()), std::to_string(1 << 20)},
                               engine_child_env(true)));
        std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
        init.kill_now();
        (void)init.wait(5s);
    }
    // Whatever state each died in, the target lets go of it and serves the next peer.
    while (target->accept(200ms).ok()) {
    }
    expect_serves_a_peer(target.get());
    EXPECT_TRUE(eventually([&] { return count_open_fds() <= fds_before + 2; }, 10s))
        << count_open_fds() << " fds, " << fds_before << " before";
}

}  // namespace
}  // namespace tcpx::testing
