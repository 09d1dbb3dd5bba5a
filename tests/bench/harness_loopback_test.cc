// The benchmark harness over 127.0.0.1 (ephemeral ports): the raw TCP baseline between an
// initiator and a responder on a thread, and the two-host side channel (--listen / --connect)
// with a stray connection refused before the real initiator is served.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench/engine/target.h"
#include "bench/harness/measure.h"
#include "bench/harness/raw_tcp.h"
#include "bench/harness/roles.h"
#include "common/socket.h"
#include "common/status_util.h"
#include "tcpx/config.h"
#include "tests/support/closed_port.h"
#include "tests/support/engine_test_util.h"

namespace tcpx::bench {
namespace {

// raw-listen's reply, "port <port> <host> <token>", and a connection that says who it is.
struct RawListener {
    StatusOr<SocketAddress> addr = invalid_argument("none");
    std::string token;
};

RawListener raw_listener(const std::string& reply) {
    RawListener out;
    const auto w = words(reply);
    uint64_t port = 0;
    if (w.size() != 4 || !parse_uint(w[1], 65535, &port) || !unhex_blob(w[3], &out.token)) {
        return out;
    }
    out.addr = SocketAddress::parse(w[2], static_cast<uint16_t>(port));
    return out;
}

Fd raw_connection(const SocketAddress& addr, const std::string& token, uint32_t index) {
    auto fd = connect_blocking(addr, 1000);
    if (!fd.ok()) return Fd();
    std::string preamble = token;
    preamble.append(reinterpret_cast<const char*>(&index), sizeof(index));
    if (!send_all(fd->get(), preamble.data(), preamble.size()).ok()) return Fd();
    return std::move(*fd);
}

// Whether the other end closed `fd` (within 1 s).
bool closed_by_peer(const Fd& fd) {
    pollfd pfd{fd.get(), POLLIN, 0};
    if (::poll(&pfd, 1, 1000) != 1) return false;
    char c;
    return ::recv(fd.get(), &c, 1, MSG_DONTWAIT) <= 0;
}

TEST(BenchRawTcpLoopback, StreamsAndPingPongs) {
    std::vector<uint8_t> theirs;
    ThreadPeer peer([&theirs](Channel* ch) {
        RawTcpResponder raw("=lo");
        const RawTcpResponder::BufferFn buffer = [&](uint64_t bytes) -> StatusOr<uint8_t*> {
            if (theirs.size() < bytes) theirs.resize(bytes);
            return theirs.data();
        };
        (void)serve_commands(
            ch,
            [&](const std::vector<std::string>& w, const std::string& line, std::string* reply) {
                Status st;
                if (!raw.handle(w, buffer, &st, reply)) return invalid_argument("unknown " + line);
                return st;
            },
            [&] { raw.close(); });
    });
    RawTcpInitiator init;
    ASSERT_TRUE(init.connect(&peer, 3).ok());
    EXPECT_EQ(init.streams(), 3);

    // Two slots of 1000 bytes each way; the last message of 5 lands in slot 0 (4 % 2).
    const uint64_t size = 1000;
    std::vector<uint8_t> ours(2 * size);
    for (size_t i = 0; i < ours.size(); ++i) ours[i] = static_cast<uint8_t>(i * 7);
    auto secs = init.stream(&peer, /*to_peer=*/true, size, 5, ours.data(), 2, 2);
    ASSERT_TRUE(secs.ok()) << secs.status().to_string();
    EXPECT_GT(*secs, 0);
    ASSERT_GE(theirs.size(), 2 * size);
    EXPECT_EQ(std::memcmp(theirs.data(), ours.data(), 2 * size), 0);

    std::fill(theirs.begin(), theirs.end(), 0x11);
    std::vector<uint8_t> back(2 * size, 0);
    secs = init.stream(&peer, /*to_peer=*/false, size, 3, back.data(), 2, 2);
    ASSERT_TRUE(secs.ok()) << secs.status().to_string();
    EXPECT_EQ(back[0], 0x11);
    EXPECT_EQ(back[2 * size - 1], 0x11);

    auto rtts = init.pingpong(&peer, 100, 32, 10, ours.data());
    ASSERT_TRUE(rtts.ok()) << rtts.status().to_string();
    EXPECT_EQ(rtts->size(), 10u);
}

TEST(BenchRawTcpLoopback, RefusesOutOfOrderCommands) {
    RawTcpResponder raw("=lo");
    Status st;
    std::string reply;
    const RawTcpResponder::BufferFn none = [](uint64_t) -> StatusOr<uint8_t*> {
        return internal_error("no buffer");
    };
    ASSERT_TRUE(raw.handle({"raw-stream", "10", "1", "1"}, none, &st, &reply));
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
    ASSERT_TRUE(raw.handle({"raw-accept", "1"}, none, &st, &reply));
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
    EXPECT_FALSE(raw.handle({"stream", "1"}, none, &st, &reply));  // not a raw-* command
}

// The raw-* commands come from the side channel, so from the network: counts and sizes past
// their bounds are refused before anything is allocated, and a peer that stops (connects without
// its index, or sends nothing of a stream) ends the command after the responder's wait, not never.
TEST(BenchRawTcpLoopback, HostileCountsSizesAndSilencesEndInErrors) {
    constexpr int kWaitMs = 200;
    RawTcpResponder raw("=lo", kWaitMs);
    int buffers_asked = 0;
    std::vector<uint8_t> mem(4096);
    const RawTcpResponder::BufferFn buffer = [&](uint64_t bytes) -> StatusOr<uint8_t*> {
        ++buffers_asked;
        if (bytes > mem.size()) return invalid_argument("too large");
        return mem.data();
    };
    Status st;
    std::string reply;
    ASSERT_TRUE(raw.handle({"raw-listen"}, buffer, &st, &reply));
    ASSERT_TRUE(st.ok()) << st.to_string();
    const RawListener at = raw_listener(reply);
    ASSERT_TRUE(at.addr.ok()) << reply;
    const SocketAddress* addr = &*at.addr;

    for (const char* n : {"0", "-1", "1025", "2147483647"}) {
        SCOPED_TRACE(std::string("raw-accept ") + n);
        ASSERT_TRUE(raw.handle({"raw-accept", n}, buffer, &st, &reply));
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
        EXPECT_NE(st.to_string().find("streams not in 1..1024"), std::string::npos);
    }

    // Nobody connects; then a connection that never says which stream it is.
    auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(raw.handle({"raw-accept", "1"}, buffer, &st, &reply));
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.to_string();
    auto silent = connect_blocking(*addr, 1000);
    ASSERT_TRUE(silent.ok());
    ASSERT_TRUE(raw.handle({"raw-accept", "1"}, buffer, &st, &reply));
    EXPECT_FALSE(st.ok());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));

    // Two connections with the token and their indices: accepted.
    std::vector<Fd> conns;
    for (uint32_t i = 0; i < 2; ++i) {
        conns.push_back(raw_connection(*addr, at.token, i));
        ASSERT_TRUE(conns.back().valid());
    }
    ASSERT_TRUE(raw.handle({"raw-accept", "1"}, buffer, &st, &reply));
    ASSERT_TRUE(st.ok()) << st.to_string();

    // size x slots = 2^64: it would wrap to a buffer of 0 bytes.
    ASSERT_TRUE(raw.handle({"raw-stream", "9223372036854775808", "1", "2"}, buffer, &st, &reply));
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.to_string().find("size x slots overflows"), std::string::npos);
    // Empty messages move nothing and never block: 2^64 - 1 of them spun for good. Refused, as
    // a count past a run's bound.
    for (const std::vector<std::string>& cmd :
         std::vector<std::vector<std::string>>{{"raw-stream", "0", "18446744073709551615", "1"},
                                               {"raw-stream", "1000", "18446744073709551615", "1"},
                                               {"raw-pingpong", "0", "18446744073709551615"},
                                               {"raw-pingpong", "0", "18446744073709551615", "0"},
                                               {"raw-pingpong", "100", "18446744073709551615"}}) {
        SCOPED_TRACE(cmd[0] + " " + cmd[1] + " " + cmd[2]);
        ASSERT_TRUE(raw.handle(cmd, buffer, &st, &reply));
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    }
    EXPECT_EQ(buffers_asked, 0);

    // A stream whose sender sends nothing, and a ping-pong whose peer says nothing.
    start = std::chrono::steady_clock::now();
    ASSERT_TRUE(raw.handle({"raw-stream", "1000", "1", "1"}, buffer, &st, &reply));
    EXPECT_FALSE(st.ok());
    ASSERT_TRUE(raw.handle({"raw-pingpong", "100", "1"}, buffer, &st, &reply));
    EXPECT_FALSE(st.ok());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
    raw.close();
}

// Connections to the raw baseline's listener that are not the initiator's (no token, the wrong
// one, an index out of range or taken, silence) are closed, and the accept goes on until the
// initiator's are all there. (It trusted the first 4 bytes of any connection: a stray failed the
// run or took a stream's place.)
TEST(BenchRawTcpLoopback, StraysAndWrongIndicesAreClosedAndAcceptGoesOn) {
    RawTcpResponder raw("=lo", 5000);
    const RawTcpResponder::BufferFn none = [](uint64_t) -> StatusOr<uint8_t*> {
        return internal_error("no buffer");
    };
    Status st;
    std::string reply;
    ASSERT_TRUE(raw.handle({"raw-listen"}, none, &st, &reply));
    ASSERT_TRUE(st.ok()) << st.to_string();
    const RawListener at = raw_listener(reply);
    ASSERT_TRUE(at.addr.ok()) << reply;
    ASSERT_EQ(at.token.size(), kRawTokenBytes);
    std::string wrong = at.token;
    wrong[0] = static_cast<char>(wrong[0] ^ 1);

    auto silent = connect_blocking(*at.addr, 1000);  // says nothing
    ASSERT_TRUE(silent.ok());
    Fd strays[] = {raw_connection(*at.addr, wrong, 0), raw_connection(*at.addr, at.token, 2),
                   raw_connection(*at.addr, at.token, 0xffffffffu)};
    auto junk = connect_blocking(*at.addr, 1000);  // an HTTP client, say
    ASSERT_TRUE(junk.ok());
    const std::string get = "GET / HTTP/1.0\r\n\r\n";
    ASSERT_TRUE(send_all(junk->get(), get.data(), get.size()).ok());
    Fd first = raw_connection(*at.addr, at.token, 0);
    Fd again = raw_connection(*at.addr, at.token, 0);  // index 0 is taken by then, or takes it
    Fd second = raw_connection(*at.addr, at.token, 1);
    ASSERT_TRUE(raw.handle({"raw-accept", "1"}, none, &st, &reply));
    EXPECT_TRUE(st.ok()) << st.to_string();
    for (const Fd& stray : strays) EXPECT_TRUE(closed_by_peer(stray));
    EXPECT_TRUE(closed_by_peer(*junk));
    EXPECT_TRUE(closed_by_peer(*silent));
    EXPECT_NE(closed_by_peer(first), closed_by_peer(again));  // one of the two holds index 0
    raw.close();
    EXPECT_TRUE(closed_by_peer(second));
}

// The initiator's raw connections time out when the responder stops (it waited in recv for ever).
TEST(BenchRawTcpLoopback, TheInitiatorsConnectionsTimeOut) {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    ThreadPeer peer([&](Channel* ch) {
        RawTcpResponder raw("=lo");
        (void)serve_commands(
            ch,
            [&](const std::vector<std::string>& w, const std::string& line, std::string* reply) {
                if (w[0] == "raw-stream") {
                    // Says nothing on its connections; closes them after 5 s at most.
                    std::unique_lock<std::mutex> lock(mu);
                    cv.wait_for(lock, std::chrono::seconds(5), [&] { return done; });
                    raw.close();
                    return Status();
                }
                Status st;
                if (!raw.handle(w, nullptr, &st, reply)) return invalid_argument("unknown " + line);
                return st;
            },
            [&] { raw.close(); });
    });
    RawTcpInitiator init(300);
    ASSERT_TRUE(init.connect(&peer, 1).ok());
    std::vector<uint8_t> buf(1000);
    const auto start = std::chrono::steady_clock::now();
    auto secs = init.stream(&peer, /*to_peer=*/false, buf.size(), 1, buf.data(), 1, 1);
    EXPECT_FALSE(secs.ok());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
    {
        std::lock_guard<std::mutex> lock(mu);
        done = true;
    }
    cv.notify_all();
}

// A reply to raw-listen that is not "port <1..65535> <host> <token>" is a protocol error (the
// port went through std::stoi, which threw, or wrapped 99999 into 34463).
TEST(BenchRawTcpLoopback, MalformedListenRepliesAreProtocolErrors) {
    const std::string token(2 * kRawTokenBytes, 'a');
    for (const std::string& said :
         {std::string("port x 1.2.3.4 ") + token, "port 99999 127.0.0.1 " + token,
          "port 0 127.0.0.1 " + token, "port -1 127.0.0.1 " + token,
          std::string("port 80 127.0.0.1"), "port 80 127.0.0.1 " + token.substr(2),
          "port 80 127.0.0.1 zz" + token.substr(2), "port 80 nothost,really " + token,
          "port 99999999999999999999 127.0.0.1 " + token}) {
        SCOPED_TRACE(said);
        ThreadPeer peer([&said](Channel* ch) {
            (void)serve_commands(
                ch,
                [&](const std::vector<std::string>&, const std::string&, std::string* reply) {
                    *reply = said;
                    return Status();
                },
                [] {});
        });
        RawTcpInitiator init(300);
        Status st;
        ASSERT_NO_THROW(st = init.connect(&peer, 1));
        EXPECT_EQ(st.code(), StatusCode::kProtocol) << st.to_string();
    }
}

// The engine bench's target, whose commands come from the network with --listen: endpoints that
// cannot all be made leave none (the ones made first stayed without their regions, and the next
// mem or rmem indexed past them: a crash). Here the second cannot listen on the port the first
// holds.
TEST(BenchEngineTarget, EndpointsThatFailPartWayLeaveNone) {
    Config c = tcpx::testing::engine_test_config();
    {
        auto probe = listen_tcp(*SocketAddress::parse("127.0.0.1", 0), 1);
        ASSERT_TRUE(probe.ok());
        auto at = local_address(probe->get());
        ASSERT_TRUE(at.ok());
        c.port = at->port();
    }  // closed: free for the target's first endpoint
    ThreadPeer peer([&c](Channel* ch) { (void)engine_bench::serve_targets(c, "=lo", false, ch); });
    auto r = peer.call("endpoints 2");
    EXPECT_FALSE(r.ok()) << "two endpoints listened on one port";
    r = peer.call("mem host 4096");
    EXPECT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("before endpoints"), std::string::npos)
        << r.status().to_string();
    r = peer.call("rmem host 00");
    EXPECT_FALSE(r.ok());
    // And the target goes on: one endpoint on the port, its memory.
    r = peer.call("endpoints 1");
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    r = peer.call("mem host 4096");
    EXPECT_TRUE(r.ok()) << r.status().to_string();
}

TEST(BenchSideChannel, HostPorts) {
    auto a = parse_host_port("127.0.0.1:80", false);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a->port(), 80);
    EXPECT_TRUE(parse_host_port("[::1]:9", false).ok());
    EXPECT_TRUE(parse_host_port("127.0.0.1:0", true).ok());
    for (const char* bad : {"127.0.0.1:0", "127.0.0.1", "::1:9", "[::1]9", ":80", "h:99999"}) {
        EXPECT_FALSE(parse_host_port(bad, false).ok()) << bad;
    }
    auto lo = interface_of(*a);
    ASSERT_TRUE(lo.ok()) << lo.status().to_string();
    EXPECT_EQ(*lo, "lo");
    // Two hosts without --interface: the side channel's, as the option's value, or why not.
    auto value = side_channel_interface(*a, "--connect");
    ASSERT_TRUE(value.ok()) << value.status().to_string();
    EXPECT_EQ(*value, "=lo");
    auto none = side_channel_interface(*parse_host_port("0.0.0.0:80", false), "--listen");
    ASSERT_FALSE(none.ok());
    EXPECT_NE(none.status().to_string().find("--listen without --interface"), std::string::npos)
        << none.status().to_string();
}

TEST(BenchSideChannel, StrayRefusedThenInitiatorServed) {
    auto listening = listen_tcp(*SocketAddress::parse("127.0.0.1", 0), 16);
    ASSERT_TRUE(listening.ok());
    Fd listener = std::move(*listening);
    ASSERT_TRUE(set_nonblocking(listener.get(), false).ok());
    const SocketAddress bound = *local_address(listener.get());
    const std::string addr = bound.to_string();
    const std::string hello = "hello test-bench 1";

    Status served;
    std::string greeting;
    std::thread target([&] {
        auto side = accept_initiator("test-bench", listener, [&](const std::string& line) {
            return line.rfind(hello, 0) == 0 ? Status() : invalid_argument("not a test-bench");
        });
        if (!side.ok()) {
            served = side.status();
            return;
        }
        greeting = side->hello;
        side->channel->write_line(hello + " target here");
        served = serve_commands(
            side->channel.get(),
            [](const std::vector<std::string>& w, const std::string&, std::string* reply) {
                *reply = "echo " + w[0];
                return Status();
            },
            [] {});
    });

    {  // A stray: answered with an error and closed; the target goes on listening.
        auto stray = connect_blocking(bound, 5000);
        ASSERT_TRUE(stray.ok());
        ASSERT_TRUE(set_nonblocking(stray->get(), false).ok());
        FdChannel ch(stray->get(), stray->get(), 5000);
        ASSERT_TRUE(ch.write_line("GET / HTTP/1.0"));
        std::string line;
        ASSERT_TRUE(ch.read_line(&line));
        EXPECT_EQ(line.rfind("error ", 0), 0u) << line;
    }
    {
        auto peer = connect_to_target(addr, 5, 5000);
        ASSERT_TRUE(peer.ok()) << peer.status().to_string();
        auto said = greet_target(peer->get(), hello, hello + " k=v", "test-bench", addr);
        ASSERT_TRUE(said.ok()) << said.status().to_string();
        EXPECT_EQ(*said, "target here");
        auto r = (*peer)->call("ping");
        ASSERT_TRUE(r.ok());
        EXPECT_EQ(*r, "echo ping");
    }  // ~SocketPeer: "quit"
    target.join();
    EXPECT_TRUE(served.ok()) << served.to_string();
    EXPECT_EQ(greeting, hello + " k=v");
}

// A connection that sends its greeting a byte at a time, more slowly than the greeting's bound
// but each byte well within it, is cut off at the bound and the next initiator is served. (The
// bound was per byte: a byte every 9 s held the serial accept loop for ever.) The initiator's
// wait for a reply is bounded the same way.
TEST(BenchSideChannel, ADribbledGreetingIsCutOffAndTheNextInitiatorServed) {
    ::signal(SIGPIPE, SIG_IGN);
    auto listening = listen_tcp(*SocketAddress::parse("127.0.0.1", 0), 16);
    ASSERT_TRUE(listening.ok());
    Fd listener = std::move(*listening);
    ASSERT_TRUE(set_nonblocking(listener.get(), false).ok());
    const SocketAddress bound = *local_address(listener.get());
    const std::string hello = "hello test-bench 1";

    std::atomic<bool> stop{false};
    // A byte of a greeting every 20 ms, for at most 5 s: never a whole line.
    auto dribble = [&stop](int fd) {
        const std::string line = "hello test-bench 1 " + std::string(300, 'k');
        for (size_t i = 0; i < line.size() && !stop; ++i) {
            if (::send(fd, &line[i], 1, MSG_NOSIGNAL) != 1) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    };
    auto slow = connect_blocking(bound, 5000);
    ASSERT_TRUE(slow.ok());
    std::thread dribbler([&] { dribble(slow->get()); });

    const auto start = std::chrono::steady_clock::now();
    Status served;
    std::thread target([&] {
        auto side = accept_initiator(
            "test-bench", listener,
            [&](const std::string& line) {
                return line.rfind(hello, 0) == 0 ? Status() : invalid_argument("not a test-bench");
            },
            /*greeting_ms=*/300);
        if (!side.ok()) {
            served = side.status();
            return;
        }
        side->channel->write_line(hello + " target here");
        served = serve_commands(
            side->channel.get(),
            [](const std::vector<std::string>&, const std::string&, std::string*) {
                return Status();
            },
            [] {});
    });
    {
        // (No ASSERT while the threads run: a failure must not end the test with them joinable.)
        auto peer = connect_to_target(bound.to_string(), 5, 5000);
        EXPECT_TRUE(peer.ok()) << peer.status().to_string();
        if (peer.ok()) {
            auto said = greet_target(peer->get(), hello, hello, "test-bench", bound.to_string());
            EXPECT_TRUE(said.ok()) << said.status().to_string();
            EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
        }
    }
    stop = true;  // unblocks the target, where it still reads the dribbled greeting
    target.join();
    EXPECT_TRUE(served.ok()) << served.to_string();
    dribbler.join();

    // A target that answers the greeting a byte at a time: the initiator gives up at its bound.
    stop = false;
    std::thread dribbling_target([&] {
        Fd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (conn.valid()) dribble(conn.get());
    });
    auto peer = connect_to_target(bound.to_string(), 5, 300);
    EXPECT_TRUE(peer.ok()) << peer.status().to_string();
    if (peer.ok()) {
        const auto asked = std::chrono::steady_clock::now();
        auto said = greet_target(peer->get(), hello, hello, "test-bench", bound.to_string());
        EXPECT_FALSE(said.ok());
        EXPECT_LT(std::chrono::steady_clock::now() - asked, std::chrono::seconds(3));
    }
    stop = true;
    if (peer.ok()) peer->reset();
    dribbling_target.join();
}

TEST(BenchSideChannel, NothingListening) {
    // (A port found free and closed again could be taken by a test running beside this one.)
    const tcpx::testing::ClosedPort closed;
    const std::string addr = "127.0.0.1:" + closed.port();
    auto peer = connect_to_target(addr, 0.3, 1000);
    ASSERT_FALSE(peer.ok());
    EXPECT_NE(peer.status().message().find("no benchmark target answers"), std::string::npos);
    EXPECT_FALSE(connect_to_target("nonsense", 0.3, 1000).ok());
}

}  // namespace
}  // namespace tcpx::bench
