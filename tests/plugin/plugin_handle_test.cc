// Handles that arrive from a peer, checked before connect() (Net::check_peer_handle) by the
// plugin wrapper: Google's TCPX layout through the emulated plugin, which follows connect_args
// as the real one does; the socket transport's exported table; and an unknown plugin.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstddef>
#include <cstring>
#include <vector>

#include "common/env.h"
#include "net/plugin/plugin_loader.h"
#include "net/plugin/tcpx_layout.h"
#include "net/plugin/v7_net.h"
#include "net/socket/socket_v7.h"
#include "net/socket/wire.h"
#include "tests/plugin/plugin_test_util.h"
#include "tests/support/net_test_util.h"

#ifndef TCPX_FAKE_TCPX_PATH
#error "TCPX_FAKE_TCPX_PATH must point at libnccl-net-faketcpx.so"
#endif

namespace tcpx::testing {
namespace {

namespace gt = net::google_tcpx;

SocketAddress loopback_peer() {
    auto addr = SocketAddress::parse("127.0.0.1", 40000);
    EXPECT_TRUE(addr.ok());
    return *addr;
}

gt::Handle as_tcpx(const net::Handle& h) {
    gt::Handle out;
    std::memcpy(&out, h.bytes.data(), sizeof(out));
    return out;
}

net::Handle from_tcpx(const gt::Handle& h, const net::Handle& tail_from) {
    net::Handle out = tail_from;
    std::memcpy(out.bytes.data(), &h, sizeof(h));
    return out;
}

// A fresh listen handle of the emulated plugin and the listener behind it.
struct Listening {
    net::Handle handle;
    net::ListenComm* listen = nullptr;
};

Listening listen_on(net::Net* net) {
    Listening l;
    EXPECT_TRUE(net->listen(0, &l.handle, &l.listen).ok());
    return l;
}

// Checks `forged` against a loopback peer; returns the status.
Status check(net::Net* net, const gt::Handle& forged, const net::Handle& base) {
    net::Handle h = from_tcpx(forged, base);
    return net->check_peer_handle(&h, loopback_peer());
}

TEST(PluginHandle, TcpxHandleHasGooglesLayout) {
    auto net = load_fake();
    ASSERT_NE(net, nullptr);
    Listening l = listen_on(net.get());
    gt::Handle h = as_tcpx(l.handle);
    EXPECT_EQ(h.connect_addr.sa.sa_family, AF_INET);
    EXPECT_NE(h.connect_addr.sin.sin_port, 0);
    EXPECT_EQ(h.num_socks, 2);  // TCPX_P2P_NSOCKS of the fake's transport
    EXPECT_EQ(h.num_threads, 1);
    EXPECT_EQ(h.connect_args, nullptr);
    EXPECT_TRUE(net->check_peer_handle(&l.handle, loopback_peer()).ok());
    EXPECT_TRUE(net->close_listen(l.listen).ok());
}

TEST(PluginHandle, ForgedTcpxHandlesAreRefused) {
    auto net = load_fake();
    ASSERT_NE(net, nullptr);
    Listening l = listen_on(net.get());
    const gt::Handle good = as_tcpx(l.handle);
    ASSERT_TRUE(check(net.get(), good, l.handle).ok());

    auto expect_refused = [&](gt::Handle forged, StatusCode code, const char* words) {
        Status st = check(net.get(), forged, l.handle);
        EXPECT_FALSE(st.ok()) << words;
        EXPECT_EQ(st.code(), code) << st.to_string();
        EXPECT_NE(st.to_string().find(words), std::string::npos) << st.to_string();
    };
    gt::Handle h = good;
    inet_pton(AF_INET, "10.1.2.3", &h.connect_addr.sin.sin_addr);
    expect_refused(h, StatusCode::kProtocol, "connect_addr names 10.1.2.3");
    h = good;
    inet_pton(AF_INET, "10.1.2.3", &h.ctrl_addr.sin.sin_addr);
    expect_refused(h, StatusCode::kProtocol, "ctrl_addr names 10.1.2.3");
    h = good;
    h.redirect_ctrl = true;
    inet_pton(AF_INET, "192.168.7.7", &h.ctrl_addr.sin.sin_addr);
    expect_refused(h, StatusCode::kProtocol, "ctrl_addr names 192.168.7.7");
    h = good;
    h.connect_addr.sa.sa_family = AF_UNIX;
    expect_refused(h, StatusCode::kInvalidArgument, "address family");
    h = good;
    h.ctrl_addr.sa.sa_family = 0;
    expect_refused(h, StatusCode::kInvalidArgument, "ctrl_addr has address family 0");
    h = good;
    h.connect_addr.sin.sin_port = 0;
    expect_refused(h, StatusCode::kInvalidArgument, "port 0");
    h = good;
    h.num_socks = 0;
    expect_refused(h, StatusCode::kInvalidArgument, "num_socks 0");
    h.num_socks = 9;
    expect_refused(h, StatusCode::kInvalidArgument, "num_socks 9");
    h = good;
    h.num_threads = 17;
    expect_refused(h, StatusCode::kInvalidArgument, "num_threads 17");
    h.num_threads = 0;
    expect_refused(h, StatusCode::kInvalidArgument, "num_threads 0");
    // Threads that would leave sockets unserved (Google's thread t serves t, t + threads, ...).
    h.num_socks = 2;
    h.num_threads = 4;
    expect_refused(h, StatusCode::kInvalidArgument, "not a multiple of num_threads 4");
    h.num_socks = 6;
    expect_refused(h, StatusCode::kInvalidArgument, "num_socks 6 is not a multiple");
    h.num_socks = 8;
    EXPECT_TRUE(check(net.get(), h, l.handle).ok());
    // A peer on IPv6 loopback is another address than 127.0.0.1.
    net::Handle copy = l.handle;
    auto v6 = SocketAddress::parse("::1", 40000);
    ASSERT_TRUE(v6.ok());
    EXPECT_EQ(net->check_peer_handle(&copy, *v6).code(), StatusCode::kProtocol);
    EXPECT_TRUE(net->close_listen(l.listen).ok());
}

// As the socket transport's: a link-local address is taken on the link the peer talks to us on,
// both of the handle's; and redirect_ctrl, a bool to the plugin, leaves as 0 or 1 whatever byte
// the wire held.
TEST(PluginHandle, ALinkLocalTcpxHandleTakesThePeersLinkAndRedirectIsABool) {
    const uint8_t fe80_1[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    gt::Handle h{};
    for (gt::SocketAddress* a : {&h.connect_addr, &h.ctrl_addr}) {
        a->sin6.sin6_family = AF_INET6;
        std::memcpy(&a->sin6.sin6_addr, fe80_1, 16);
        a->sin6.sin6_port = htons(5000);
        a->sin6.sin6_scope_id = 77;  // the peer's interface index
    }
    h.num_socks = 2;
    h.num_threads = 1;
    net::Handle handle;
    std::memcpy(handle.bytes.data(), &h, sizeof(h));
    handle.bytes[offsetof(gt::Handle, redirect_ctrl)] = 0x5a;
    sockaddr_in6 from{};
    from.sin6_family = AF_INET6;
    std::memcpy(&from.sin6_addr, fe80_1, 16);
    from.sin6_scope_id = 3;  // where it reached us
    auto peer = SocketAddress::from_sockaddr(reinterpret_cast<sockaddr*>(&from), sizeof(from));
    ASSERT_TRUE(peer.ok());
    ASSERT_TRUE(net::check_tcpx_handle(&handle, *peer).ok());
    const gt::Handle checked = as_tcpx(handle);
    EXPECT_EQ(checked.connect_addr.sin6.sin6_scope_id, 3u);
    EXPECT_EQ(checked.ctrl_addr.sin6.sin6_scope_id, 3u);
    EXPECT_EQ(handle.bytes[offsetof(gt::Handle, redirect_ctrl)], 1);
    // Checked again: the same bytes. A zero byte stays 0.
    net::Handle again = handle;
    ASSERT_TRUE(net::check_tcpx_handle(&again, *peer).ok());
    EXPECT_EQ(again.bytes, handle.bytes);
    again.bytes[offsetof(gt::Handle, redirect_ctrl)] = 0;
    ASSERT_TRUE(net::check_tcpx_handle(&again, *peer).ok());
    EXPECT_EQ(again.bytes[offsetof(gt::Handle, redirect_ctrl)], 0);
    // Another link-local host is refused as any other host is.
    from.sin6_addr.s6_addr[15] = 2;
    auto other = SocketAddress::from_sockaddr(reinterpret_cast<sockaddr*>(&from), sizeof(from));
    ASSERT_TRUE(other.ok());
    net::Handle copy = handle;
    EXPECT_EQ(net::check_tcpx_handle(&copy, *other).code(), StatusCode::kProtocol);
}

// A handle's num_threads is how many helper threads Google's connect starts for the comm, on our
// side only: lowered to our own count (NCCL_SOCKET_NTHREADS), to a divisor of num_socks so that
// every socket is still served. A peer asking for 16 had us start 16 threads per comm (32 per
// peer at two channels, 32,768 for MAX_PEERS strangers).
TEST(PluginHandle, APeersThreadCountIsLoweredToOurs) {
    const auto lowered = [](int socks, int threads, int ours) {
        gt::Handle h{};
        for (gt::SocketAddress* a : {&h.connect_addr, &h.ctrl_addr}) {
            a->sin.sin_family = AF_INET;
            inet_pton(AF_INET, "127.0.0.1", &a->sin.sin_addr);
            a->sin.sin_port = htons(5000);
        }
        h.num_socks = socks;
        h.num_threads = threads;
        net::Handle handle;
        std::memcpy(handle.bytes.data(), &h, sizeof(h));
        const Status st = net::check_tcpx_handle(&handle, loopback_peer(), ours);
        EXPECT_TRUE(st.ok()) << st.to_string();
        const gt::Handle out = as_tcpx(handle);
        EXPECT_EQ(out.num_socks, socks);
        EXPECT_EQ(out.num_socks % out.num_threads, 0);
        return out.num_threads;
    };
    EXPECT_EQ(lowered(8, 8, 1), 1);
    EXPECT_EQ(lowered(8, 8, 2), 2);
    EXPECT_EQ(lowered(8, 8, 3), 2);  // the largest divisor of 8 within 3
    EXPECT_EQ(lowered(6, 6, 4), 3);
    EXPECT_EQ(lowered(8, 4, 16), 4);  // never raised
    EXPECT_EQ(lowered(4, 2, 0), 1);   // (ours below 1 is taken as 1)
    // Ours as the plugin reads it: NCCL_SOCKET_NTHREADS, 1 where unset or nonsense.
    const std::optional<std::string> saved = env_get("NCCL_SOCKET_NTHREADS");
    setenv("NCCL_SOCKET_NTHREADS", "2", 1);
    EXPECT_EQ(net::own_tcpx_threads(), 2);
    setenv("NCCL_SOCKET_NTHREADS", "99", 1);
    EXPECT_EQ(net::own_tcpx_threads(), gt::kMaxThreads);
    unsetenv("NCCL_SOCKET_NTHREADS");
    EXPECT_EQ(net::own_tcpx_threads(), 1);
    if (saved.has_value()) setenv("NCCL_SOCKET_NTHREADS", saved->c_str(), 1);
}

TEST(PluginHandle, GarbageConnectArgsIsResetAndTheConnectionWorks) {
    auto net = load_fake();
    ASSERT_NE(net, nullptr);
    Listening l = listen_on(net.get());
    gt::Handle h = as_tcpx(l.handle);
    // What a hostile peer sends: a pointer of its choosing where the plugin keeps its own
    // connect state (followed on the first connect() if left), and junk after the struct.
    h.connect_args = reinterpret_cast<void*>(uintptr_t{0xdeadbeef00});
    net::Handle wire = from_tcpx(h, l.handle);
    for (size_t i = sizeof(gt::Handle); i < wire.bytes.size(); ++i) wire.bytes[i] = 0xa5;
    ASSERT_TRUE(net->check_peer_handle(&wire, loopback_peer()).ok());
    EXPECT_EQ(as_tcpx(wire).connect_args, nullptr);
    for (size_t i = sizeof(gt::Handle); i < wire.bytes.size(); ++i) {
        ASSERT_EQ(wire.bytes[i], 0) << "byte " << i;
    }

    net::SendComm* send = nullptr;
    net::RecvComm* recv = nullptr;
    net::DeviceHandle dev;
    ASSERT_TRUE(eventually([&] {
        if (send == nullptr && !net->connect(0, &wire, &send, nullptr).ok()) return true;
        if (recv == nullptr && !net->accept(l.listen, &recv, &dev).ok()) return true;
        return send != nullptr && recv != nullptr;
    }));
    ASSERT_NE(send, nullptr);
    ASSERT_NE(recv, nullptr);
    std::vector<uint8_t> src(100 * 1024), dst(src.size());
    fill_pattern(src.data(), src.size(), 77);
    net::MemHandle* smr = nullptr;
    net::MemHandle* rmr = nullptr;
    ASSERT_TRUE(net->reg_mr(send, src.data(), src.size(), net::MemType::kHost, &smr).ok());
    ASSERT_TRUE(net->reg_mr(recv, dst.data(), dst.size(), net::MemType::kHost, &rmr).ok());
    net::Request* rr = nullptr;
    void* d = dst.data();
    size_t n = dst.size();
    int tag = 3;
    ASSERT_TRUE(net->irecv(recv, 1, &d, &n, &tag, &rmr, &rr).ok());
    ASSERT_NE(rr, nullptr);
    net::Request* sr = nullptr;
    ASSERT_TRUE(net->isend(send, src.data(), src.size(), 3, smr, &sr).ok());
    ASSERT_NE(sr, nullptr);
    ASSERT_TRUE(wait_request(net.get(), sr).ok());
    ASSERT_TRUE(wait_request(net.get(), rr).ok());
    EXPECT_EQ(find_pattern_mismatch(dst.data(), dst.size(), 77), -1);
    EXPECT_TRUE(net->irecv_consumed(recv, 1, rr).ok());
    EXPECT_TRUE(net->dereg_mr(send, smr).ok());
    EXPECT_TRUE(net->dereg_mr(recv, rmr).ok());
    EXPECT_TRUE(net->close_send(send).ok());
    EXPECT_TRUE(net->close_recv(recv).ok());
    EXPECT_TRUE(net->close_listen(l.listen).ok());
}

TEST(PluginHandle, NoWireHandlesPassTheCheck) {
    setenv("FAKETCPX_NO_WIRE", "1", 1);
    auto net = load_fake();
    ASSERT_NE(net, nullptr);
    Listening l = listen_on(net.get());
    unsetenv("FAKETCPX_NO_WIRE");
    ASSERT_NE(l.listen, nullptr);
    net::Handle wire = l.handle;
    EXPECT_TRUE(net->check_peer_handle(&wire, loopback_peer()).ok());
    net::SendComm* send = nullptr;
    net::RecvComm* recv = nullptr;
    net::DeviceHandle dev;
    ASSERT_TRUE(eventually([&] {
        if (send == nullptr && !net->connect(0, &wire, &send, nullptr).ok()) return true;
        if (recv == nullptr && !net->accept(l.listen, &recv, &dev).ok()) return true;
        return send != nullptr && recv != nullptr;
    }));
    ASSERT_NE(send, nullptr);
    ASSERT_NE(recv, nullptr);
    EXPECT_TRUE(net->close_send(send).ok());
    EXPECT_TRUE(net->close_recv(recv).ok());
    EXPECT_TRUE(net->close_listen(l.listen).ok());
}

TEST(PluginHandle, SocketTableHandlesAreCheckedLikeTheSocketTransport) {
    Settings settings = loopback_settings();
    settings.nsocks = 2;
    auto net = make_net(Provider::kSocketV7, settings);
    ASSERT_NE(net, nullptr);
    EXPECT_EQ(net->name(), net::kSocketTableName);
    net::Handle handle;
    net::ListenComm* listen = nullptr;
    ASSERT_TRUE(net->listen(0, &handle, &listen).ok());
    net::wire::HandleBlob good;
    std::memcpy(&good, handle.bytes.data(), sizeof(good));

    auto with = [&](const net::wire::HandleBlob& b) {
        net::Handle h = handle;
        std::memcpy(h.bytes.data(), &b, sizeof(b));
        return h;
    };
    net::wire::HandleBlob b = good;
    b.connect_key = 0x1234567890;
    net::Handle h = with(b);
    h.bytes[100] = 0x77;
    ASSERT_TRUE(net->check_peer_handle(&h, loopback_peer()).ok());
    net::wire::HandleBlob after;
    std::memcpy(&after, h.bytes.data(), sizeof(after));
    EXPECT_EQ(after.connect_key, 0u);
    EXPECT_EQ(h.bytes[100], 0);

    b = good;
    b.nsocks = 65;  // above the 64 a handle may offer (connect() would open NSOCKS of them)
    h = with(b);
    EXPECT_EQ(net->check_peer_handle(&h, loopback_peer()).code(), StatusCode::kInvalidArgument);
    b = good;
    inet_pton(AF_INET, "10.9.9.9", b.addr);
    h = with(b);
    Status st = net->check_peer_handle(&h, loopback_peer());
    EXPECT_EQ(st.code(), StatusCode::kProtocol) << st.to_string();
    b = good;
    b.magic = 0;
    h = with(b);
    EXPECT_EQ(net->check_peer_handle(&h, loopback_peer()).code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(net->close_listen(listen).ok());
}

TEST(PluginHandle, UnknownPluginsCannotCheck) {
    set_socket_env(loopback_settings());
    auto settings = Settings::from_env();
    ASSERT_TRUE(settings.ok());
    auto net =
        net::load_net_plugin(std::string(TCPX_TEST_NET_DIR) + "/libnccl-net-testv8.so", *settings);
    ASSERT_TRUE(net.ok()) << net.status().to_string();
    net::Handle h;
    EXPECT_EQ((*net)->check_peer_handle(&h, loopback_peer()).code(), StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace tcpx::testing
