// External ncclNet plugins through the loader, as a user would point the engine at Google's
// libnccl-net-tcpx.so: the emulated TCPX plugin (host memory), its rules enforced, and the engine
// running over it.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <thread>

#include "common/socket.h"
#include "cuda/unpack.h"
#include "cuda/unpack_defs.h"
#include "net/plugin/plugin_loader.h"
#include "net/plugin/tcpx_layout.h"
#include "net/plugin/v7_net.h"
#include "net/v7_common.h"
#include "tests/plugin/plugin_test_util.h"
#include "tests/support/alloc_fault.h"
#include "tests/support/engine_test_util.h"
#include "tests/support/log_capture.h"
#include "tests/support/net_test_util.h"

#ifndef TCPX_FAKE_TCPX_PATH
#error "TCPX_FAKE_TCPX_PATH must point at libnccl-net-faketcpx.so"
#endif

namespace tcpx::testing {
namespace {

using namespace std::chrono_literals;
using net::Request;

struct Pair {
    net::SendComm* send = nullptr;
    net::RecvComm* recv = nullptr;
    net::DeviceHandle dev;
};

Pair connect_fake(net::Net* net) {
    Pair p;
    net::Handle handle;
    net::ListenComm* listen = nullptr;
    EXPECT_TRUE(net->listen(0, &handle, &listen).ok());
    for (int i = 0; i < 1000000 && (p.send == nullptr || p.recv == nullptr); ++i) {
        if (p.send == nullptr) {
            EXPECT_TRUE(net->connect(0, &handle, &p.send, nullptr).ok());
        }
        if (p.recv == nullptr) {
            EXPECT_TRUE(net->accept(listen, &p.recv, &p.dev).ok());
        }
    }
    EXPECT_TRUE(net->close_listen(listen).ok());
    return p;
}

Settings env_settings() {
    auto settings = Settings::from_env();
    EXPECT_TRUE(settings.ok()) << settings.status().to_string();
    return settings.ok() ? *settings : Settings{};
}

// Connects to `handle`, whose listener is parked in an accept, until no listener is parked: each
// call of connect and listen retries the parked accept. The connection may be closed as soon as
// it is accepted, so the connect may end either way; *send is the comm it made, if any.
void connect_until_unparked(net::Net* net, net::V7Net* v7, net::Handle* handle,
                            net::SendComm** send) {
    bool connecting = true;
    for (int i = 0; i < 200000 && v7->parked_listeners() != 0; ++i) {
        if (connecting && *send == nullptr) {
            connecting = net->connect(0, handle, send, nullptr).ok();
        } else {
            net::Handle other;
            net::ListenComm* l = nullptr;
            ASSERT_TRUE(net->listen(0, &other, &l).ok());
            ASSERT_TRUE(net->close_listen(l).ok());
        }
    }
}

// A listener with an accept started (no peer yet: in progress), then closed: parked in `v7`;
// *handle is what a peer connects to.
void park_listener(net::Net* net, net::V7Net* v7, net::Handle* handle) {
    const size_t parked = v7->parked_listeners();
    net::ListenComm* listen = nullptr;
    ASSERT_TRUE(net->listen(0, handle, &listen).ok());
    net::RecvComm* recv = nullptr;
    net::DeviceHandle dev;
    ASSERT_TRUE(net->accept(listen, &recv, &dev).ok());
    ASSERT_EQ(recv, nullptr);  // started, in progress
    ASSERT_TRUE(net->close_listen(listen).ok());
    ASSERT_EQ(v7->parked_listeners(), parked + 1);
}

// A listener of the emulated plugin with a stranger's silent connection on it and an accept in
// progress waiting for that connection's hello (as a stranger that sent its HELLO and never
// connected its data sockets leaves one); *to is the listener's data address.
void listen_with_silent_stranger(net::Net* net, net::ListenComm** listen, Fd* stranger,
                                 SocketAddress* to) {
    net::Handle handle;
    ASSERT_TRUE(net->listen(0, &handle, listen).ok());
    net::google_tcpx::Handle h;
    std::memcpy(&h, handle.bytes.data(), sizeof(h));
    const auto addr = SocketAddress::from_sockaddr(&h.connect_addr.sa, sizeof(sockaddr_in));
    ASSERT_TRUE(addr.ok()) << addr.status().to_string();
    *to = *addr;
    *stranger = Fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_EQ(::connect(stranger->get(), to->get(), to->size()), 0);
    net::RecvComm* recv = nullptr;
    net::DeviceHandle dev;
    for (int i = 0; i < 10; ++i) {  // the stranger's connection taken, waiting for its hello
        ASSERT_TRUE(net->accept(*listen, &recv, &dev).ok());
        ASSERT_EQ(recv, nullptr);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
}

// Whether the other end has closed `fd` within two seconds (EOF or reset).
bool closed_within_2s(const Fd& fd) {
    pollfd p{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 2000) != 1) return false;
    char c;
    return ::recv(fd.get(), &c, 1, 0) <= 0;
}

// Google's plugin accepts in a thread that blocks in accept() and recv() on the listener's sockets
// and uses the listen comm its closeListen frees. A listener closed during an accept is parked,
// and the accept ended at once: every socket bound to the listener's addresses is shut down (the
// listening ones and a stranger's connection, silent, that the accept was waiting on), the
// accept fails, and the listener is closed after it (the emulation refuses closeListen before,
// with a warning). Before, a peer that sent its HELLO and never connected kept the plugin's
// thread, listen comm and sockets for good. Nothing of it stays open.
TEST(PluginLoader, ClosingAListenerDuringAnAcceptEndsTheAccept) {
    auto net = load_fake();
    ASSERT_NE(net, nullptr);
    auto* v7 = dynamic_cast<net::V7Net*>(net.get());
    ASSERT_NE(v7, nullptr);
    LogCapture capture(LogLevel::kWarn);
    const int fds_before = count_open_fds();
    net::ListenComm* listen = nullptr;
    Fd stranger;
    SocketAddress to;
    ASSERT_NO_FATAL_FAILURE(listen_with_silent_stranger(net.get(), &listen, &stranger, &to));
    ASSERT_TRUE(net->close_listen(listen).ok());
    EXPECT_EQ(v7->parked_listeners(), 0u) << "the parked accept did not end";
    EXPECT_TRUE(closed_within_2s(stranger)) << "the stranger's connection is still open";
    stranger.reset();
    Fd late(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    EXPECT_NE(::connect(late.get(), to.get(), to.size()), 0) << "the listener still listens";
    late.reset();
    EXPECT_FALSE(capture.contains("closeListen while an accept")) << capture.all();
    EXPECT_TRUE(eventually([&] { return count_open_fds() <= fds_before; }, std::chrono::seconds(5)))
        << count_open_fds() << " descriptors open, " << fds_before << " before";
}

// Strangers can park listeners as fast as they send HELLOs, and each ending scans the process's
// descriptors: one scan serves every listener parked meanwhile, at most once a second. Five
// parked at once all end within a couple of seconds of progress() calls, every stranger's
// connection closed.
TEST(PluginLoader, ListenersParkedTogetherEndTogether) {
    auto net = load_fake();
    ASSERT_NE(net, nullptr);
    auto* v7 = dynamic_cast<net::V7Net*>(net.get());
    ASSERT_NE(v7, nullptr);
    std::vector<Fd> strangers(5);
    for (Fd& stranger : strangers) {
        net::ListenComm* listen = nullptr;
        SocketAddress to;
        ASSERT_NO_FATAL_FAILURE(listen_with_silent_stranger(net.get(), &listen, &stranger, &to));
        ASSERT_TRUE(net->close_listen(listen).ok());
    }
    EXPECT_TRUE(eventually(
        [&] {
            (void)net->progress();
            return v7->parked_listeners() == 0;
        },
        std::chrono::seconds(5)))
        << v7->parked_listeners() << " listeners still parked";
    for (const Fd& stranger : strangers) {
        EXPECT_TRUE(closed_within_2s(stranger)) << "a stranger's connection is still open";
    }
}

// With the accept left to end by itself (a listener whose accept cannot be ended: another
// layout than Google's, or one that handed out a comm), it is kept until then, then closed with
// the connection it yielded.
TEST(PluginLoader, ClosingAListenerDuringAnAcceptWaitsForTheAccept) {
    auto net = load_fake();
    ASSERT_NE(net, nullptr);
    auto* v7 = dynamic_cast<net::V7Net*>(net.get());
    ASSERT_NE(v7, nullptr);
    v7->set_end_parked_accepts(false);
    LogCapture capture(LogLevel::kWarn);
    net::Handle handle;
    ASSERT_NO_FATAL_FAILURE(park_listener(net.get(), v7, &handle));
    // A peer connects after all: the accept ends, its connection and the listener are closed.
    net::SendComm* send = nullptr;
    ASSERT_NO_FATAL_FAILURE(connect_until_unparked(net.get(), v7, &handle, &send));
    EXPECT_EQ(v7->parked_listeners(), 0u);
    if (send != nullptr) {
        EXPECT_TRUE(net->close_send(send).ok());
    }
    EXPECT_FALSE(capture.contains("closeListen while an accept")) << capture.all();
    // No peer ever comes: the listener stays parked, and the net goes away cleanly.
    net::Handle lonely;
    ASSERT_NO_FATAL_FAILURE(park_listener(net.get(), v7, &lonely));
    net.reset();
    EXPECT_FALSE(capture.contains("closeListen while an accept")) << capture.all();
}

// A parked listener whose accept ends is collected by progress() (which the engine calls on every
// pass), not only by the next listen, connect, accept or close_listen: after the last peer's
// setup none may come. Here the connecting side is another wrapper of the same plugin, so the
// listener's wrapper sees nothing but progress() calls.
TEST(PluginLoader, AParkedListenerIsCollectedByProgress) {
    auto net = load_fake();
    auto other = load_fake();
    ASSERT_TRUE(net != nullptr && other != nullptr);
    auto* v7 = dynamic_cast<net::V7Net*>(net.get());
    ASSERT_NE(v7, nullptr);
    v7->set_end_parked_accepts(false);  // (the accept ends by itself, with a peer)
    net::Handle handle;
    ASSERT_NO_FATAL_FAILURE(park_listener(net.get(), v7, &handle));
    net::SendComm* send = nullptr;
    bool connecting = true;
    for (int i = 0; i < 5000 && v7->parked_listeners() != 0; ++i) {
        if (connecting && send == nullptr) {
            connecting = other->connect(0, &handle, &send, nullptr).ok();
        }
        EXPECT_FALSE(net->progress());
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_EQ(v7->parked_listeners(), 0u) << "progress() did not collect the ended accept";
    if (send != nullptr) {
        EXPECT_TRUE(other->close_send(send).ok());
    }
}

// Google's accept can fail after it has made the comm (setting up the device handle fails) and
// hands it out with the error: the comm is closed, its threads and sockets do not stay.
TEST(PluginLoader, AnAcceptThatFailsWithACommClosesIt) {
    auto net = load_fake();
    ASSERT_NE(net, nullptr);
    void* lib = ::dlopen(TCPX_FAKE_TCPX_PATH, RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(lib, nullptr);
    auto open_comms = reinterpret_cast<int (*)()>(::dlsym(lib, "faketcpx_open_comms"));
    ASSERT_NE(open_comms, nullptr);
    const int before = open_comms();
    setenv("FAKETCPX_ACCEPT_FAILS", "1", 1);
    net::Handle handle;
    net::ListenComm* listen = nullptr;
    ASSERT_TRUE(net->listen(0, &handle, &listen).ok());
    net::SendComm* send = nullptr;
    net::RecvComm* recv = nullptr;
    net::DeviceHandle dev;
    Status accepted;
    for (int i = 0; i < 1000000 && accepted.ok(); ++i) {
        if (send == nullptr) {
            ASSERT_TRUE(net->connect(0, &handle, &send, nullptr).ok());
        }
        accepted = net->accept(listen, &recv, &dev);
        ASSERT_EQ(recv, nullptr);
    }
    unsetenv("FAKETCPX_ACCEPT_FAILS");
    EXPECT_FALSE(accepted.ok()) << "the accept never failed";
    EXPECT_NE(accepted.to_string().find("accept"), std::string::npos) << accepted.to_string();
    // The send side is still open; the receive side is closed already.
    EXPECT_EQ(open_comms(), before + (send != nullptr ? 1 : 0));
    if (send != nullptr) {
        EXPECT_TRUE(net->close_send(send).ok());
    }
    EXPECT_TRUE(net->close_listen(listen).ok());
    EXPECT_EQ(open_comms(), before);
    ::dlclose(lib);
}

// The same for a listener closed during the accept: the parked accept that ends with an error
// and the comm closes the comm as well.
TEST(PluginLoader, AParkedAcceptThatFailsWithACommClosesIt) {
    auto net = load_fake();
    ASSERT_NE(net, nullptr);
    auto* v7 = dynamic_cast<net::V7Net*>(net.get());
    ASSERT_NE(v7, nullptr);
    v7->set_end_parked_accepts(false);  // (the accept ends by itself, with a peer)
    void* lib = ::dlopen(TCPX_FAKE_TCPX_PATH, RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(lib, nullptr);
    auto open_comms = reinterpret_cast<int (*)()>(::dlsym(lib, "faketcpx_open_comms"));
    ASSERT_NE(open_comms, nullptr);
    const int before = open_comms();
    net::Handle handle;
    ASSERT_NO_FATAL_FAILURE(park_listener(net.get(), v7, &handle));
    setenv("FAKETCPX_ACCEPT_FAILS", "1", 1);
    // The parked accept ends with the error once the peer is in.
    net::SendComm* send = nullptr;
    ASSERT_NO_FATAL_FAILURE(connect_until_unparked(net.get(), v7, &handle, &send));
    unsetenv("FAKETCPX_ACCEPT_FAILS");
    ASSERT_EQ(v7->parked_listeners(), 0u);
    // Only the send side may be open: the failed accept's receive comm is closed.
    EXPECT_EQ(open_comms(), before + (send != nullptr ? 1 : 0));
    if (send != nullptr) {
        EXPECT_TRUE(net->close_send(send).ok());
    }
    EXPECT_EQ(open_comms(), before);
    ::dlclose(lib);
}

TEST(PluginLoader, RefusesWhatIsNoPlugin) {
    auto missing = net::load_net_plugin("/nonexistent/libnccl-net-nothing.so", env_settings());
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.status().message().find("cannot load"), std::string::npos);
    auto libc = net::load_net_plugin("libc.so.6", env_settings());  // loads, but has no table
    ASSERT_FALSE(libc.ok());
    EXPECT_NE(libc.status().message().find("ncclNetPlugin_v7"), std::string::npos)
        << libc.status().to_string();
    EXPECT_FALSE(net::load_net_plugin("", env_settings()).ok());
}

TEST(PluginLoader, EmulatedTcpxLooksLikeTcpx) {
    unsetenv("NCCL_DYNAMIC_CHUNK_SIZE");  // the loader must supply it (the plugin insists)
    auto net = load_fake();
    ASSERT_NE(net, nullptr);
    EXPECT_EQ(net->name(), "GPUDirectTCPX_v7_emulated");
    ASSERT_NE(getenv("NCCL_DYNAMIC_CHUNK_SIZE"), nullptr);
    EXPECT_STREQ(getenv("NCCL_DYNAMIC_CHUNK_SIZE"), "524288");
    net::Properties props;
    ASSERT_TRUE(net->get_properties(0, &props).ok());
    EXPECT_EQ(props.device_type, net::DeviceType::kUnpack);
    EXPECT_EQ(props.device_version, 7);
    EXPECT_EQ(props.max_recvs, 1);
    EXPECT_EQ(props.max_requests, 16);
    EXPECT_FALSE(props.reports_sizes);
    // Google's places bytes of GPU receives in their buffers itself (PLUGIN_PLACES_BYTES=auto).
    EXPECT_TRUE(props.places_bytes);
    EXPECT_NE(net::tcpx_env_defaults().find("NCCL_DYNAMIC_CHUNK_SIZE=524288"), std::string::npos);
    setenv("TCPX_P2P_PLUGIN_PLACES_BYTES", "off", 1);
    auto off = load_fake();
    unsetenv("TCPX_P2P_PLUGIN_PLACES_BYTES");
    ASSERT_NE(off, nullptr);
    ASSERT_TRUE(off->get_properties(0, &props).ok());
    EXPECT_FALSE(props.places_bytes);
}

// Google's plugin sends without MSG_NOSIGNAL: a send on a connection its peer reset raises
// SIGPIPE, whose default action ends the process (a peer that crashes mid-transfer, a stranger
// that connects to its listener and goes). Loading a plugin sets a default SIGPIPE to ignored, and
// leaves an application's own handler alone.
TEST(PluginLoader, LoadingAPluginKeepsSigpipeFromEndingTheProcess) {
    struct sigaction saved {};
    ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &saved), 0);
    ::signal(SIGPIPE, SIG_DFL);
    auto net = load_fake();
    ASSERT_NE(net, nullptr);
    struct sigaction now {};
    ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &now), 0);
    ASSERT_EQ(now.sa_handler, SIG_IGN) << "SIGPIPE keeps its default action";
    // A send as the plugin makes it, on a connection whose peer is gone: EPIPE, not the end.
    int pair[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
    ::close(pair[1]);
    const char byte = 0;
    EXPECT_EQ(::send(pair[0], &byte, 1, 0), -1);
    EXPECT_EQ(errno, EPIPE);
    ::close(pair[0]);
    // The application's own handler stays.
    static std::atomic<int> caught{0};
    ::signal(
        SIGPIPE, +[](int) { caught.fetch_add(1); });
    auto again = load_fake();
    ASSERT_NE(again, nullptr);
    ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &now), 0);
    EXPECT_NE(now.sa_handler, SIG_IGN);
    EXPECT_NE(now.sa_handler, SIG_DFL);
    ASSERT_EQ(::sigaction(SIGPIPE, &saved, nullptr), 0);
}

TEST(PluginLoader, TheEmulationEnforcesTcpxRules) {
    auto net = load_fake();
    ASSERT_NE(net, nullptr);
    Pair p = connect_fake(net.get());
    ASSERT_NE(p.send, nullptr);
    ASSERT_NE(p.recv, nullptr);
    EXPECT_EQ(p.dev.type, net::DeviceType::kUnpack);
    std::vector<uint8_t> src(64 * 1024), dst(64 * 1024);
    fill_pattern(src.data(), src.size(), 5);
    net::MemHandle* smr = nullptr;
    net::MemHandle* rmr = nullptr;
    ASSERT_TRUE(net->reg_mr(p.send, src.data(), src.size(), net::MemType::kHost, &smr).ok());
    ASSERT_TRUE(net->reg_mr(p.recv, dst.data(), dst.size(), net::MemType::kHost, &rmr).ok());
    // CUDA registrations must be 4 KiB-aligned (checked before any CUDA call).
    net::MemHandle* bad = nullptr;
    EXPECT_FALSE(net->reg_mr(p.recv, dst.data() + 1, 100, net::MemType::kCuda, &bad).ok());

    // n != 1 receives are refused.
    void* bufs[2] = {dst.data(), dst.data() + 100};
    size_t sizes[2] = {100, 100};
    int tags[2] = {0, 0};
    net::MemHandle* mhs[2] = {rmr, rmr};
    Request* r2 = nullptr;
    EXPECT_FALSE(net->irecv(p.recv, 2, bufs, sizes, tags, mhs, &r2).ok());

    // 16 requests per comm; test() in order only; sizes never reported.
    std::vector<Request*> sends;
    for (int i = 0; i < 17; ++i) {
        Request* r = nullptr;
        ASSERT_TRUE(net->isend(p.send, src.data() + i * 1024, 1024, 0, smr, &r).ok());
        if (i < 16) {
            ASSERT_NE(r, nullptr) << i;
            sends.push_back(r);
        } else {
            EXPECT_EQ(r, nullptr) << "a 17th request in flight";
        }
    }
    bool done = false;
    EXPECT_FALSE(net->test(sends[1], &done, nullptr).ok()) << "test out of order was accepted";
    // (That failed test released its wrapper; the request itself is still the plugin's.)
    std::vector<Request*> recvs;
    for (int i = 0; i < 16; ++i) {
        Request* r = nullptr;
        void* d = dst.data() + i * 1024;
        size_t n = 1024;
        int tag = 0;
        ASSERT_TRUE(net->irecv(p.recv, 1, &d, &n, &tag, &rmr, &r).ok());
        ASSERT_NE(r, nullptr);
        recvs.push_back(r);
    }
    size_t got = 12345;
    ASSERT_TRUE(wait_request(net.get(), recvs[0], &got).ok());
    EXPECT_EQ(got, 12345u) << "sizes must not be reported";
    // All 16 unpack slots are held until consumed: no 17th receive.
    Request* extra = nullptr;
    void* d = dst.data();
    size_t n = 1;
    int tag = 0;
    ASSERT_TRUE(net->irecv(p.recv, 1, &d, &n, &tag, &rmr, &extra).ok());
    EXPECT_EQ(extra, nullptr);
    // Consuming out of order is refused; in order frees the slot.
    ASSERT_TRUE(wait_request(net.get(), recvs[1]).ok());
    EXPECT_FALSE(net->irecv_consumed(p.recv, 1, recvs[1]).ok());
    ASSERT_TRUE(net->irecv_consumed(p.recv, 1, recvs[0]).ok());
    ASSERT_TRUE(net->irecv_consumed(p.recv, 1, recvs[1]).ok());
    ASSERT_TRUE(net->irecv(p.recv, 1, &d, &n, &tag, &rmr, &extra).ok());
    EXPECT_NE(extra, nullptr);
    EXPECT_EQ(find_pattern_mismatch(dst.data(), 2048, 5), -1);
    // Teardown with requests pending is allowed: the comms are closed with them, and their
    // registrations deregistered after (before, with requests still posted with them, deregMr
    // is refused: the real plugin's pages and descriptor would go from under the requests).
    EXPECT_FALSE(net->dereg_mr(p.send, smr).ok());
    EXPECT_FALSE(net->dereg_mr(p.recv, rmr).ok());
    EXPECT_TRUE(net->close_send(p.send).ok());
    EXPECT_TRUE(net->close_recv(p.recv).ok());
    EXPECT_TRUE(net->dereg_mr(nullptr, smr).ok());
    EXPECT_TRUE(net->dereg_mr(nullptr, rmr).ok());
}

// GPU registrations of an external plugin each take a place in the process's descriptor
// budget (MAX_SOCKETS, shared with the sockets: Google's plugin holds a dma-buf fd for each),
// host ones none; past it regMr is not called and the registration is refused
// (RESOURCE_EXHAUSTED); deregMr gives the place back, and so does a deregMr after the comm's
// close (Google's close releases no registration, so they stay counted until then).
TEST(PluginLoader, GpuRegistrationsTakePlacesInTheDescriptorBudget) {
    auto net = load_fake();
    ASSERT_NE(net, nullptr);
    net::Properties props;
    ASSERT_TRUE(net->get_properties(0, &props).ok());
    EXPECT_TRUE(props.gpu_regs_counted);
    void* lib = ::dlopen(TCPX_FAKE_TCPX_PATH, RTLD_NOW);
    ASSERT_NE(lib, nullptr);
    auto open_cuda = reinterpret_cast<int (*)()>(::dlsym(lib, "faketcpx_open_cuda_mrs"));
    ASSERT_NE(open_cuda, nullptr);
    Pair p = connect_fake(net.get());
    ASSERT_TRUE(p.send && p.recv);
    constexpr size_t kLen = 64 << 10;
    void* buf = std::aligned_alloc(4096, kLen);
    ASSERT_NE(buf, nullptr);
    const uint64_t held = registrations_held();
    const int cuda_before = open_cuda();
    net::MemHandle* host = nullptr;
    net::MemHandle* a = nullptr;
    net::MemHandle* b = nullptr;
    net::MemHandle* c = nullptr;
    ASSERT_TRUE(net->reg_mr(p.send, buf, kLen, net::MemType::kHost, &host).ok());
    EXPECT_EQ(registrations_held(), held);
    struct Budget {
        explicit Budget(uint64_t b) { set_socket_budget_for_testing(b); }
        ~Budget() { set_socket_budget_for_testing(0); }
    };
    std::optional<Budget> budget(std::in_place, budget_used() + 2);
    ASSERT_TRUE(net->reg_mr(p.send, buf, kLen, net::MemType::kCuda, &a).ok());
    ASSERT_TRUE(net->reg_mr(p.recv, buf, kLen, net::MemType::kCuda, &b).ok());
    EXPECT_EQ(registrations_held(), held + 2);
    const Status full = net->reg_mr(p.send, buf, kLen, net::MemType::kCuda, &c);
    EXPECT_EQ(full.code(), StatusCode::kResourceExhausted) << full.to_string();
    EXPECT_NE(full.message().find("GPU registrations of the ncclNet plugin"), std::string::npos)
        << full.to_string();
    EXPECT_EQ(open_cuda(), cuda_before + 2) << "regMr called past the budget";
    // No socket either (one budget).
    EXPECT_EQ(socket_budget_room(1, "test").code(), StatusCode::kResourceExhausted);
    ASSERT_TRUE(net->dereg_mr(p.send, a).ok());
    EXPECT_EQ(registrations_held(), held + 1);
    ASSERT_TRUE(net->reg_mr(p.send, buf, kLen, net::MemType::kCuda, &c).ok());
    budget.reset();
    // Closed with the comms: still counted (the plugin still holds them) until deregistered.
    EXPECT_TRUE(net->dereg_mr(p.send, host).ok());
    EXPECT_TRUE(net->close_send(p.send).ok());
    EXPECT_TRUE(net->close_recv(p.recv).ok());
    EXPECT_EQ(registrations_held(), held + 2);
    EXPECT_TRUE(net->dereg_mr(nullptr, b).ok());
    EXPECT_TRUE(net->dereg_mr(nullptr, c).ok());
    EXPECT_EQ(registrations_held(), held);
    EXPECT_EQ(open_cuda(), cuda_before);
    std::free(buf);
    ::dlclose(lib);
}

// A plugin call that lets a C++ exception out is taken for an internal error: a registration
// refused (its place in the descriptor budget given back), a close that still closes. Before,
// the exception went through the caller's frames: out of the engine's teardown, which closes
// comms and cannot throw, it ended the application.
TEST(PluginLoader, AnExceptionOutOfThePluginIsAnError) {
    auto net = load_fake();
    ASSERT_NE(net, nullptr);
    Pair p = connect_fake(net.get());
    ASSERT_TRUE(p.send && p.recv);
    constexpr size_t kLen = 64 << 10;
    void* buf = std::aligned_alloc(4096, kLen);
    ASSERT_NE(buf, nullptr);
    const uint64_t held = registrations_held();
    ::setenv("FAKETCPX_THROW", "regMr", 1);
    net::MemHandle* mh = nullptr;
    const Status reg = net->reg_mr(p.send, buf, kLen, net::MemType::kCuda, &mh);
    EXPECT_FALSE(reg.ok());
    EXPECT_EQ(registrations_held(), held);
    ::setenv("FAKETCPX_THROW", "closeSend", 1);
    EXPECT_FALSE(net->close_send(p.send).ok());
    ::unsetenv("FAKETCPX_THROW");
    EXPECT_TRUE(net->close_recv(p.recv).ok());
    std::free(buf);
}

// A listen that succeeds without a comm, and an accept that hands out a comm open already, are
// errors: the first would have accept and closeListen handed a null comm, the second the comm
// closed twice.
TEST(PluginLoader, ANullListenCommAndACommHandedOutTwiceAreRefused) {
    auto net = load_fake();
    ASSERT_NE(net, nullptr);
    ::setenv("FAKETCPX_NULL_LISTEN", "1", 1);
    net::Handle handle;
    net::ListenComm* listen = nullptr;
    const Status st = net->listen(0, &handle, &listen);
    ::unsetenv("FAKETCPX_NULL_LISTEN");
    EXPECT_EQ(st.code(), StatusCode::kInternal) << st.to_string();
    EXPECT_EQ(listen, nullptr);
    Pair first = connect_fake(net.get());
    ASSERT_TRUE(first.send && first.recv);
    ::setenv("FAKETCPX_SAME_COMM", "1", 1);
    Pair second;
    ASSERT_TRUE(net->listen(0, &handle, &listen).ok());
    Status refused;
    for (int i = 0; i < 1000000 && refused.ok() && second.recv == nullptr; ++i) {
        if (second.send == nullptr) {
            ASSERT_TRUE(net->connect(0, &handle, &second.send, nullptr).ok());
        }
        refused = net->accept(listen, &second.recv, &second.dev);
    }
    ::unsetenv("FAKETCPX_SAME_COMM");
    EXPECT_EQ(refused.code(), StatusCode::kInternal) << refused.to_string();
    EXPECT_NE(refused.message().find("open already"), std::string::npos) << refused.to_string();
    EXPECT_EQ(second.recv, nullptr);
    EXPECT_TRUE(net->close_listen(listen).ok());
    EXPECT_TRUE(net->close_send(first.send).ok());
    EXPECT_TRUE(net->close_recv(first.recv).ok());
    if (second.send != nullptr) {
        EXPECT_TRUE(net->close_send(second.send).ok());
    }
}

// A receive into CUDA memory arrives as devmem TCP delivers it: scattered pages of the comm's
// bounce buffer, described in the unpack queue slot the request names, counted at test(), the
// pages recycled (and poisoned) at irecvConsumed.
TEST(PluginLoader, TheEmulationDeliversCudaReceivesAsScatteredPages) {
    auto net = load_fake();
    ASSERT_NE(net, nullptr);
    Pair p = connect_fake(net.get());
    ASSERT_TRUE(p.send && p.recv);
    ASSERT_EQ(p.dev.type, net::DeviceType::kUnpack);
    ASSERT_EQ(p.dev.version, 7);
    ASSERT_EQ(p.dev.size, sizeof(cuda::UnpackHandle));
    cuda::UnpackHandle h;
    std::memcpy(&h, p.dev.handle, sizeof(h));  // host mode: the handle is in host memory
    ASSERT_NE(h.meta, nullptr);
    ASSERT_NE(h.bounce_buf, nullptr);
    EXPECT_EQ(h.head, ~uint64_t{0});

    constexpr size_t kMax = 4 << 20;
    std::vector<uint8_t> src(kMax);
    auto* dst = static_cast<uint8_t*>(std::aligned_alloc(4096, kMax + 4096));
    ASSERT_NE(dst, nullptr);
    net::MemHandle* smr = nullptr;
    net::MemHandle* rmr = nullptr;
    ASSERT_TRUE(net->reg_mr(p.send, src.data(), kMax, net::MemType::kHost, &smr).ok());
    ASSERT_TRUE(net->reg_mr(p.recv, dst, kMax + 4096, net::MemType::kCuda, &rmr).ok());

    // More than 4 MiB per CUDA receive is refused (one slot holds 2048 pages).
    {
        Request* r = nullptr;
        void* d = dst;
        size_t n = kMax + 1;
        int tag = 0;
        EXPECT_FALSE(net->irecv(p.recv, 1, &d, &n, &tag, &rmr, &r).ok());
    }
    int expected_slot = -1;
    const size_t lens[] = {kMax, kMax - 3, 1, 0, 70001};
    for (size_t len : lens) {
        SCOPED_TRACE("len " + std::to_string(len));
        fill_pattern(src.data(), len, len + 1);
        std::memset(dst, 0, kMax);
        Request* rr = nullptr;
        void* d = dst;
        size_t n = kMax;
        int tag = 0;
        ASSERT_TRUE(net->irecv(p.recv, 1, &d, &n, &tag, &rmr, &rr).ok());
        ASSERT_NE(rr, nullptr);
        // The slot is not readable before test() reports the receive.
        EXPECT_FALSE(net->unpack_slot(p.recv, rr).ok());
        Request* sr = nullptr;
        ASSERT_TRUE(net->isend(p.send, src.data(), len, 0, smr, &sr).ok());
        ASSERT_NE(sr, nullptr);
        ASSERT_TRUE(wait_request(net.get(), sr).ok());
        ASSERT_TRUE(wait_request(net.get(), rr).ok());
        EXPECT_EQ(dst[0], 0) << "bytes landed in the destination, not the bounce buffer";
        auto slot = net->unpack_slot(p.recv, rr);
        ASSERT_TRUE(slot.ok()) << slot.status().to_string();
        const int q = slot->index;
        ASSERT_GE(q, 0);
        ASSERT_LT(q, cuda::kUnpackQueueDepth);
        if (expected_slot >= 0) {
            EXPECT_EQ(q, expected_slot) << "slots go round in order";
        }
        expected_slot = (q + 1) % cuda::kUnpackQueueDepth;
        // The request names the slot's host addresses (host mode: the queue is host memory).
        EXPECT_EQ(slot->count, &h.meta->cnt[q]);
        EXPECT_EQ(slot->entries, static_cast<const void*>(h.meta->mem[q]));
        const uint64_t count = *slot->count;
        ASSERT_LE(count, static_cast<uint64_t>(cuda::kUnpackMaxEntries));
        // Pieces: within one page each, distinct pages, covering [0, len) exactly once.
        const cuda::LoadMeta* e = h.meta->mem[q];
        std::vector<std::pair<uint64_t, uint32_t>> cover;
        std::set<uint32_t> pages;
        int partial = 0;
        for (uint64_t k = 0; k < count; ++k) {
            ASSERT_GE(e[k].len, 1u);
            ASSERT_LE(e[k].src_off % 4096 + e[k].len, 4096u) << "a piece crossing a page";
            EXPECT_TRUE(pages.insert(e[k].src_off / 4096).second) << "a page used twice";
            partial += e[k].len < 4096 ? 1 : 0;
            cover.emplace_back(e[k].dst_off, e[k].len);
        }
        std::sort(cover.begin(), cover.end());
        uint64_t at = 0;
        for (auto [off, n2] : cover) {
            ASSERT_EQ(off, at);
            at += n2;
        }
        EXPECT_EQ(at, len);
        if (len >= kMax - 3) {
            EXPECT_GT(partial, 8) << "pieces of pages, not only whole ones";
        }
        // Gathered, the pages hold the message.
        ASSERT_TRUE(cuda::unpack_reference(e, count, h.bounce_buf, dst, kMax));
        EXPECT_EQ(find_pattern_mismatch(dst, len, len + 1), -1);
        // Given back, the pages are poisoned and the count is garbage again.
        const std::vector<std::pair<uint64_t, uint32_t>> first(
            count > 0 ? 1 : 0, std::make_pair(uint64_t{e[0].src_off}, e[0].len));
        ASSERT_TRUE(net->irecv_consumed(p.recv, 1, rr).ok());
        for (auto [src_off, n2] : first) {
            for (uint32_t i = 0; i < n2; ++i) ASSERT_EQ(h.bounce_buf[src_off + i], 0xdb);
        }
        EXPECT_GT(h.meta->cnt[q], static_cast<uint64_t>(cuda::kUnpackMaxEntries));
    }
    (void)net->dereg_mr(p.send, smr);
    (void)net->dereg_mr(p.recv, rmr);
    EXPECT_TRUE(net->close_send(p.send).ok());
    EXPECT_TRUE(net->close_recv(p.recv).ok());
    std::free(dst);
}

// The engine over the emulated plugin: everything it must get right with Google's (16 requests,
// FIFO tests, a registration for every buffer, irecvConsumed after every receive, the device
// handle on accept, the handle kept across connect retries).
class EngineOverPlugin : public ::testing::Test {
 protected:
    void SetUp() override {
        load_fake();  // sets the environment the plugin reads
        Config c = engine_test_config();
        c.net_plugin = TCPX_FAKE_TCPX_PATH;
        c.window = 64;  // more than the plugin allows: the engine must cap it
        a_ = make_endpoint("a", c);
        b_ = make_endpoint("b", c);
        ASSERT_TRUE(a_ && b_);
        l_ = link(a_.get(), b_.get());
        ASSERT_NE(l_.a_to_b, 0u);
    }
    std::unique_ptr<Endpoint> a_, b_;
    Link l_;
};

TEST_F(EngineOverPlugin, WritesReadsAndSendsArrive) {
    constexpr size_t kSize = 12 << 20;
    GuardedBuffer abuf(kSize), bbuf(kSize);
    MemId am = *a_->reg(abuf.data(), kSize);
    MemId bm = *b_->reg(bbuf.data(), kSize);
    RemoteMem bd = *b_->describe(bm);
    // Many chunks in flight at once (more than 16 per channel).
    std::vector<XferId> ids;
    for (int i = 0; i < 6; ++i) {
        const uint64_t off = static_cast<uint64_t>(i) * (2 << 20);
        fill_pattern(abuf.data() + off, 2 << 20, 40 + i);
        auto w = a_->write(l_.a_to_b, am, off, bd, off, 2 << 20,
                           i == 5 ? std::optional<std::string_view>("last") : std::nullopt);
        ASSERT_TRUE(w.ok()) << w.status().to_string();
        ids.push_back(*w);
    }
    for (XferId id : ids) {
        Status st = a_->wait(id, 30s);
        ASSERT_TRUE(st.ok()) << st.to_string();
    }
    for (int i = 0; i < 6; ++i) {
        EXPECT_EQ(find_pattern_mismatch(bbuf.data() + i * (2 << 20), 2 << 20, 40 + i), -1) << i;
    }
    ASSERT_TRUE(eventually([&] {
        auto n = b_->get_notifications();
        return !n.empty() && n[0].payload == "last";
    }));
    std::memset(abuf.data(), 0, kSize);
    auto r = a_->read(l_.a_to_b, am, 0, bd, 0, kSize);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(a_->wait(*r, 30s).ok());
    for (int i = 0; i < 6; ++i) {
        EXPECT_EQ(find_pattern_mismatch(abuf.data() + i * (2 << 20), 2 << 20, 40 + i), -1) << i;
    }
    // Small ones travel inline, larger ones on the plugin's comms; send/recv too.
    fill_pattern(abuf.data(), 3 << 20, 9);
    auto rv = b_->recv(l_.b_to_a, bm, 0, 3 << 20, 7);
    auto sd = a_->send(l_.a_to_b, am, 0, 3 << 20, 7);
    ASSERT_TRUE(rv.ok() && sd.ok());
    EXPECT_TRUE(a_->wait(*sd, 30s).ok());
    EXPECT_TRUE(b_->wait(*rv, 30s).ok());
    EXPECT_EQ(find_pattern_mismatch(bbuf.data(), 3 << 20, 9), -1);
    EXPECT_TRUE(abuf.canaries_intact() && bbuf.canaries_intact());
    ASSERT_TRUE(a_->dereg(am).ok());
    ASSERT_TRUE(b_->dereg(bm).ok());
}

TEST_F(EngineOverPlugin, RefusedWritesDrainThroughThePlugin) {
    GuardedBuffer abuf(4 << 20), bbuf(4 << 20, 0x33);
    MemId am = *a_->reg(abuf.data(), abuf.size());
    MemId bm = *b_->reg(bbuf.data(), bbuf.size());
    RemoteMem forged = *b_->describe(bm);
    forged.key ^= 1;
    auto w = a_->write(l_.a_to_b, am, 0, forged, 0, 4 << 20);
    ASSERT_TRUE(w.ok());
    EXPECT_EQ(a_->wait(*w, 30s).code(), StatusCode::kNotFound);
    EXPECT_EQ(std::count(bbuf.data(), bbuf.data() + bbuf.size(), 0x33),
              static_cast<long>(bbuf.size()));
    // In step afterwards.
    fill_pattern(abuf.data(), 4 << 20, 2);
    auto ok = a_->write(l_.a_to_b, am, 0, *b_->describe(bm), 0, 4 << 20);
    ASSERT_TRUE(ok.ok());
    EXPECT_TRUE(a_->wait(*ok, 30s).ok());
    EXPECT_EQ(find_pattern_mismatch(bbuf.data(), 4 << 20, 2), -1);
}

// A transport that takes no send request, ever, with none of ours in it ("full" for good): the
// write fails after our peer timeout with the reason, not when (or if) the peer times out its
// receive. Here the peer's timeout is a minute, ours 2.5 s.
TEST(EngineOverPluginFailure, ATransportThatNeverTakesARequestFailsThePeerAfterTheTimeout) {
    load_fake();
    Config c = engine_test_config();
    c.net_plugin = TCPX_FAKE_TCPX_PATH;
    Config mine = c;
    mine.peer_timeout_ms = 2500;  // (the peer's heartbeats come every second at most)
    c.peer_timeout_ms = 60000;
    auto a = make_endpoint("a", mine);
    auto b = make_endpoint("b", c);
    ASSERT_TRUE(a && b);
    const Link l = link(a.get(), b.get());
    ASSERT_NE(l.a_to_b, 0u);
    constexpr size_t kSize = 1 << 20;  // past the inline limit: a data channel's
    GuardedBuffer abuf(kSize), bbuf(kSize);
    const MemId am = *a->reg(abuf.data(), kSize);
    const MemId bm = *b->reg(bbuf.data(), kSize);
    ::setenv("FAKETCPX_FULL_SENDS", "1", 1);
    auto w = a->write(l.a_to_b, am, 0, *b->describe(bm), 0, kSize);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    const Status st = a->wait(*w, 10s);
    ::unsetenv("FAKETCPX_FULL_SENDS");
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.to_string();
    const Status peer = a->peer_status(l.a_to_b);
    EXPECT_NE(peer.message().find("the transport took no send request"), std::string::npos)
        << peer.to_string();
}

// A reader, a peer it reads from and a bystander it writes to, over the emulated plugin, each
// with its own fault rules (TCPX_P2P_FAULT) and the given peer timeout.
struct ReaderPeerBystander {
    ReaderPeerBystander(int64_t peer_timeout_ms, const char* reader_fault, const char* peer_fault) {
        load_fake();
        Config c = engine_test_config();
        c.net_plugin = TCPX_FAKE_TCPX_PATH;
        c.peer_timeout_ms = peer_timeout_ms;
        Config r = c, p = c;
        r.fault = reader_fault;
        p.fault = peer_fault;
        reader = make_endpoint("reader", r);
        peer = make_endpoint("peer", p);
        bystander = make_endpoint("bystander", c);
        if (!reader || !peer || !bystander) return;
        const Link l = link(reader.get(), peer.get());
        to_peer = l.a_to_b;
        peer_to_reader = l.b_to_a;
        to_bystander = link(reader.get(), bystander.get()).a_to_b;
    }
    bool ok() const { return to_peer != 0 && to_bystander != 0; }
    std::unique_ptr<Endpoint> reader, peer, bystander;
    PeerId to_peer = 0, to_bystander = 0;
    PeerId peer_to_reader = 0;  // (the peer's id of the reader)
};

// A peer that fails while the plugin still holds one of our receives: the plugin's close may
// not release the registration (ncclNet v7 asks for deregMr first), so the request gets a grace
// of 100 ms to end before its comm is closed with it. The grace runs over later progress passes:
// while it lasts, the peer already reads as failed, its transfer is still held (the plugin may
// yet write into its memory), and the endpoint's other peers are served; only then does the
// transfer fail, not a byte of its memory written. (Before, the grace was spun through under
// the endpoint's lock: the peer's failure and its transfer's came in one step, every other peer
// waiting.)
TEST(EngineOverPluginFailure, AFailingPeersGraceHoldsUpNoOtherPeer) {
    // Registrations of the emulated plugin (its close releases none, as Google's does not).
    void* lib = ::dlopen(TCPX_FAKE_TCPX_PATH, RTLD_NOW);
    ASSERT_NE(lib, nullptr);
    auto open_mrs = reinterpret_cast<int (*)()>(::dlsym(lib, "faketcpx_open_mrs"));
    ASSERT_NE(open_mrs, nullptr);
    const int mrs_before = open_mrs();
    // The data of our read never leaves the peer. A peer timeout with room for the grace: the
    // peer, not heard from during it (heartbeats come at a quarter of the timeout), must not
    // time us out before our BYE comes, even on a loaded machine.
    ReaderPeerBystander t(1000, "", "drop:isend:1");
    ASSERT_TRUE(t.ok());
    Endpoint* ep = t.reader.get();
    Endpoint* stalled = t.peer.get();
    Endpoint* bystander = t.bystander.get();
    constexpr size_t kLen = 512 << 10;  // two chunks, past the inline limit
    GuardedBuffer dst(kLen, 0xee), theirs(kLen, 0x5a), bbuf(4096, 0x33);
    const MemId mem = *ep->reg(dst.data(), kLen);
    const MemId tmem = *stalled->reg(theirs.data(), kLen);
    const MemId bmem = *bystander->reg(bbuf.data(), bbuf.size());
    const RemoteMem tdesc = *stalled->describe(tmem);
    const RemoteMem bdesc = *bystander->describe(bmem);
    LogCapture log(LogLevel::kDebug);
    auto x = ep->read(t.to_peer, mem, 0, tdesc, 0, kLen);
    ASSERT_TRUE(x.ok()) << x.status().to_string();
    // Bystander writes until the read ends; those posted once the peer reads as failed and
    // finished while its read was still held are counted.
    int during_grace = 0;
    XferStatus xs;
    for (;;) {
        const bool peer_failed = !ep->peer_status(t.to_peer).ok();
        auto w = ep->write(t.to_bystander, mem, 0, bdesc, 0, 64);
        ASSERT_TRUE(w.ok()) << w.status().to_string();
        ASSERT_TRUE(ep->wait(*w, 5s).ok());
        xs = ep->poll(*x);
        if (xs.state != XferState::kInProgress) break;
        if (peer_failed) ++during_grace;
    }
    EXPECT_EQ(xs.error.code(), StatusCode::kTimeout) << xs.error.to_string();
    std::printf("bystander writes done during the failed peer's grace: %d\n", during_grace);
    EXPECT_GT(during_grace, 0) << "the grace held the endpoint";
    EXPECT_TRUE(log.contains("transport requests abandoned at close (after a grace")) << log.all();
    // The peer, heartbeating through our grace, hears why at its end: our BYE, not a reset
    // (a socket closed with its heartbeats unread would have sent one).
    ASSERT_TRUE(eventually([&] { return !stalled->peer_status(t.peer_to_reader).ok(); }, 5s));
    const Status theirs_ended = stalled->peer_status(t.peer_to_reader);
    EXPECT_NE(theirs_ended.message().find("peer disconnected: TIMEOUT"), std::string::npos)
        << theirs_ended.to_string();
    // The chunk whose data was dropped left its memory alone; the other chunk's data may have
    // landed (a failed read's destination holds what arrived): nothing but the peer's bytes.
    for (size_t i = 0; i < kLen; ++i) {
        ASSERT_TRUE(dst.data()[i] == 0xee || dst.data()[i] == 0x5a) << "byte " << i;
    }
    EXPECT_GT(std::count(dst.data(), dst.data() + kLen, 0xee), 0);
    EXPECT_TRUE(dst.canaries_intact());
    // The endpoint serves on, and the failed peer goes.
    EXPECT_TRUE(ep->disconnect(t.to_peer).ok());
    EXPECT_FALSE(ep->peer_status(t.to_peer).ok());
    fill_pattern(dst.data(), 4096, 8);
    auto w = ep->write(t.to_bystander, mem, 0, bdesc, 0, 4096);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    ASSERT_TRUE(ep->wait(*w, 5s).ok());
    EXPECT_EQ(find_pattern_mismatch(bbuf.data(), 4096, 8), -1);
    // Every registration went, those the failed peer's comms were closed with included
    // (deregistered after the close): none stays for a peer that failed with requests in flight.
    t.reader.reset();
    t.peer.reset();
    t.bystander.reset();
    EXPECT_EQ(open_mrs(), mrs_before);
    ::dlclose(lib);
}

// A read whose receive the plugin completes but never reports (our side's fault): ended by
// disconnect(), which returns once the plugin has let go, after the request's grace, waiting
// without the endpoint's lock (writes to a bystander posted and finished meanwhile, from
// another thread), the read failed, its memory free to go; or by dereg() of its region, which
// gives up on the peer after the peer timeout and returns once the grace is over, the read
// failed; or failed by its stall check and the endpoint destroyed while the grace may still
// run, which finishes it first.
TEST(EngineOverPluginFailure, DisconnectDeregAndDestroyDuringAGraceLetTheTransportGoFirst) {
    for (const char* how : {"disconnect", "dereg", "destroy"}) {
        SCOPED_TRACE(how);
        const std::string_view mode = how;
        const bool destroy = mode == "destroy";
        // disconnect() well before the stall check; the others wait for a timeout. The first
        // completion, the read's, is never reported.
        ReaderPeerBystander t(mode == "disconnect" ? 5000 : 500, "drop:test:1", "");
        ASSERT_TRUE(t.ok());
        std::unique_ptr<Endpoint>& ep = t.reader;
        Endpoint* peer = t.peer.get();
        Endpoint* bystander = t.bystander.get();
        constexpr size_t kLen = 256 << 10;  // one chunk
        GuardedBuffer dst(kLen, 0xee), theirs(kLen, 0x5a), bbuf(4096, 0x33);
        const MemId mem = *ep->reg(dst.data(), kLen);
        const MemId tmem = *peer->reg(theirs.data(), kLen);
        const MemId bmem = *bystander->reg(bbuf.data(), bbuf.size());
        const RemoteMem bdesc = *bystander->describe(bmem);
        LogCapture log(LogLevel::kDebug);
        auto x = ep->read(t.to_peer, mem, 0, *peer->describe(tmem), 0, kLen);
        ASSERT_TRUE(x.ok()) << x.status().to_string();
        ASSERT_TRUE(eventually([&] { return log.contains("drop:test:1 fires"); }, 10s))
            << log.all();
        ASSERT_EQ(ep->poll(*x).state, XferState::kInProgress);
        if (destroy) {
            ASSERT_TRUE(eventually([&] { return !ep->peer_status(t.to_peer).ok(); }, 10s));
            ep.reset();
            EXPECT_TRUE(log.contains("transport requests in flight get up to 100 ms")) << log.all();
            EXPECT_TRUE(log.contains("transport requests abandoned at close (after a grace"))
                << log.all();
            continue;  // (the plugin wrote the read's bytes: its receive did complete)
        }
        if (mode == "dereg") {
            const Status st = ep->dereg(mem);
            EXPECT_TRUE(st.ok()) << st.to_string();
            const XferStatus xs = ep->poll(*x);
            EXPECT_EQ(xs.state, XferState::kFailed);
            EXPECT_EQ(xs.error.code(), StatusCode::kTimeout) << xs.error.to_string();
            EXPECT_TRUE(log.contains("transport requests abandoned at close (after a grace"))
                << log.all();
            EXPECT_TRUE(dst.canaries_intact());
            continue;
        }
        std::atomic<bool> disconnecting{false}, stop{false};
        std::atomic<int> during{0}, total{0};
        Status writer_error;
        std::thread writer([&] {
            while (!stop.load()) {
                const bool began_during = disconnecting.load();
                auto w = ep->write(t.to_bystander, mem, 0, bdesc, 0, 64);
                writer_error = w.ok() ? ep->wait(*w, 5s) : w.status();
                if (!writer_error.ok()) return;
                ++total;
                if (began_during && disconnecting.load()) ++during;
            }
        });
        std::this_thread::sleep_for(20ms);
        disconnecting.store(true);
        const Status st = ep->disconnect(t.to_peer);
        disconnecting.store(false);
        stop.store(true);
        writer.join();
        ASSERT_TRUE(st.ok()) << st.to_string();
        EXPECT_TRUE(writer_error.ok()) << writer_error.to_string();
        std::printf("bystander writes done during disconnect(): %d of %d\n", during.load(),
                    total.load());
        EXPECT_GE(during.load(), 3) << "disconnect() held the endpoint through the grace\n"
                                    << log.all();
        const XferStatus xs = ep->poll(*x);
        EXPECT_EQ(xs.state, XferState::kFailed);
        EXPECT_EQ(xs.error.code(), StatusCode::kCancelled) << xs.error.to_string();
        EXPECT_TRUE(log.contains("transport requests abandoned at close (after a grace"))
            << log.all();
        EXPECT_TRUE(ep->dereg(mem).ok());
        EXPECT_TRUE(dst.canaries_intact());
    }
}

TEST(PluginLoader, AFloodOfPluginWarningsIsCutToTheBurst) {
    // Like Google's plugin, the emulation then logs a WARN for every host receive.
    setenv("FAKETCPX_WARN_HOST_RECV", "1", 1);
    setenv("TCPX_P2P_PLUGIN_LOG_BURST", "5", 1);
    setenv("TCPX_P2P_PLUGIN_LOG_INTERVAL_MS", "86400000", 1);
    auto net = load_fake();
    unsetenv("TCPX_P2P_PLUGIN_LOG_BURST");
    unsetenv("TCPX_P2P_PLUGIN_LOG_INTERVAL_MS");
    ASSERT_NE(net, nullptr);
    LogCapture capture(LogLevel::kWarn);
    Pair p = connect_fake(net.get());
    ASSERT_NE(p.send, nullptr);
    ASSERT_NE(p.recv, nullptr);
    std::vector<uint8_t> src(4096), dst(4096);
    net::MemHandle* smr = nullptr;
    net::MemHandle* rmr = nullptr;
    ASSERT_TRUE(net->reg_mr(p.send, src.data(), src.size(), net::MemType::kHost, &smr).ok());
    ASSERT_TRUE(net->reg_mr(p.recv, dst.data(), dst.size(), net::MemType::kHost, &rmr).ok());
    constexpr int kReceives = 40;
    for (int i = 0; i < kReceives; ++i) {
        fill_pattern(src.data(), src.size(), 100 + i);
        Request* rr = nullptr;
        void* d = dst.data();
        size_t n = dst.size();
        int tag = 1;
        ASSERT_TRUE(net->irecv(p.recv, 1, &d, &n, &tag, &rmr, &rr).ok());
        ASSERT_NE(rr, nullptr);
        Request* sr = nullptr;
        ASSERT_TRUE(net->isend(p.send, src.data(), src.size(), 1, smr, &sr).ok());
        ASSERT_NE(sr, nullptr);
        ASSERT_TRUE(wait_request(net.get(), sr).ok());
        ASSERT_TRUE(wait_request(net.get(), rr).ok());
        ASSERT_EQ(find_pattern_mismatch(dst.data(), dst.size(), 100 + i), -1) << i;
        ASSERT_TRUE(net->irecv_consumed(p.recv, 1, rr).ok());
    }
    unsetenv("FAKETCPX_WARN_HOST_RECV");
    EXPECT_EQ(capture.count("host receive"), 5) << capture.all();
    EXPECT_TRUE(net->dereg_mr(p.send, smr).ok());
    EXPECT_TRUE(net->dereg_mr(p.recv, rmr).ok());
    EXPECT_TRUE(net->close_send(p.send).ok());
    EXPECT_TRUE(net->close_recv(p.recv).ok());
}

// The logger a plugin is given is called through a C function pointer, from the plugin's C
// frames: an allocation that fails in it (the rate limiter's table, the line) drops the line;
// nothing may leave it.
TEST(PluginLoader, ThePluginsLoggerDropsALineItCannotAllocateFor) {
    const tcpx_ncclDebugLogger_t logger = net::nccl_logger_into_tcpx_log();
    LogCapture capture(LogLevel::kWarn);
    long hits = 0;
    for (long skip = 0; skip < 12; ++skip) {
        test::AllocFault fault("", skip, 1000);
        // A new file and line each time: a new entry in the rate limiter.
        const std::string file = "plugin_file_" + std::to_string(skip) + ".c";
        EXPECT_NO_THROW(logger(TCPX_NCCL_LOG_WARN, 0, file.c_str(), 10, "line %ld", skip)) << skip;
        hits += fault.failed() > 0;
    }
    EXPECT_GT(hits, 0) << "no allocation failed";
    logger(TCPX_NCCL_LOG_WARN, 0, "plugin_file_after.c", 10, "after the shortage");
    EXPECT_EQ(capture.count("after the shortage"), 1) << capture.all();
}

// A line without a format (a null fmt, and a null file) is logged as such, not read from
// address 0.
TEST(PluginLoader, ThePluginsLoggerTakesALineWithoutAFormat) {
    const tcpx_ncclDebugLogger_t logger = net::nccl_logger_into_tcpx_log();
    LogCapture capture(LogLevel::kWarn);
    logger(TCPX_NCCL_LOG_WARN, 0, nullptr, 11, nullptr);
    EXPECT_EQ(capture.count("(a line without a format)"), 1) << capture.all();
}

}  // namespace
}  // namespace tcpx::testing
