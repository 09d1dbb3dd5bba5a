#include "common/socket.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sanitizer/asan_interface.h>  // (its poisoning macros do nothing outside ASan)
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "tests/support/net_test_util.h"
#include "tests/support/sanitizers.h"

namespace tcpx {
namespace {

TEST(SocketAddress, ParsesBothFamilies) {
    auto v4 = SocketAddress::parse("127.0.0.1", 5000);
    ASSERT_TRUE(v4.ok());
    EXPECT_EQ(v4->family(), AF_INET);
    EXPECT_EQ(v4->port(), 5000);
    EXPECT_TRUE(v4->is_loopback());
    EXPECT_EQ(v4->to_string(), "127.0.0.1:5000");
    auto v6 = SocketAddress::parse("[::1]", 80);
    ASSERT_TRUE(v6.ok());
    EXPECT_EQ(v6->family(), AF_INET6);
    EXPECT_TRUE(v6->is_loopback());
    EXPECT_EQ(v6->to_string(), "[::1]:80");
    EXPECT_FALSE(SocketAddress::parse("example.com", 1).ok());  // numeric only: no DNS
    EXPECT_FALSE(SocketAddress::parse("300.1.1.1", 1).ok());
}

TEST(Interfaces, SpecSyntax) {
    EXPECT_TRUE(interface_matches("eth", "eth0"));
    EXPECT_TRUE(interface_matches("eth,ib", "ib1"));
    EXPECT_FALSE(interface_matches("eth", "lo"));
    EXPECT_FALSE(interface_matches("^eth", "eth3"));
    EXPECT_TRUE(interface_matches("^eth", "lo"));
    EXPECT_TRUE(interface_matches("=eth0", "eth0"));
    EXPECT_FALSE(interface_matches("=eth0", "eth01"));
    EXPECT_FALSE(interface_matches("^=lo", "lo"));
    EXPECT_TRUE(interface_matches("^=lo", "lo2"));
}

TEST(Interfaces, LoopbackIsFound) {
    auto ifs = find_interfaces("=lo", AddressFamily::kIPv4);
    ASSERT_TRUE(ifs.ok()) << ifs.status().to_string();
    ASSERT_EQ(ifs->size(), 1u);
    EXPECT_EQ((*ifs)[0].name, "lo");
    EXPECT_EQ((*ifs)[0].address.host_string(), "127.0.0.1");
    auto none = find_interfaces("=nonexistent9", AddressFamily::kAny);
    EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
}

// Which addresses a peer's connection handle may name, from where its control connection comes.
TEST(SocketAddress, HandlesMayNameOnlyThePeersHost) {
    auto lo = *SocketAddress::parse("127.0.0.1", 0);
    auto lo2 = *SocketAddress::parse("127.0.0.2", 0);
    auto far = *SocketAddress::parse("198.51.100.7", 0);  // TEST-NET-2: not this host's
    EXPECT_TRUE(names_peer_host(lo, lo));
    EXPECT_TRUE(names_peer_host(far, far));
    EXPECT_FALSE(names_peer_host(lo, far));  // a remote peer may not send us to our loopback
    EXPECT_FALSE(names_peer_host(far, lo));  // nor a local one to a third host
    EXPECT_FALSE(names_peer_host(lo2, lo));  // nor to another loopback address
    EXPECT_TRUE(is_own_address(lo2));
    EXPECT_FALSE(is_own_address(far));
    // A peer on loopback may name this host's other interfaces (its data NICs).
    auto others = find_interfaces("^=lo", AddressFamily::kAny);
    if (!others.ok() || others->empty()) GTEST_SKIP() << "this host has no interface but lo";
    const SocketAddress& own = (*others)[0].address;
    EXPECT_TRUE(is_own_address(own)) << own.to_string();
    EXPECT_TRUE(names_peer_host(own, lo)) << own.to_string();
    EXPECT_FALSE(names_peer_host(own, far)) << own.to_string();
}

TEST(Sockets, ListenConnectAcceptAndPartialIo) {
    auto addr = SocketAddress::parse("127.0.0.1", 0);
    auto listener = listen_tcp(*addr, 16);
    ASSERT_TRUE(listener.ok());
    auto bound = local_address(listener->get());
    ASSERT_TRUE(bound.ok());
    EXPECT_NE(bound->port(), 0);
    auto client = start_connect(*bound);
    ASSERT_TRUE(client.ok());
    Fd server;
    for (int i = 0; i < 1000 && !server.valid(); ++i) {
        auto s = accept_tcp(listener->get(), nullptr);
        ASSERT_TRUE(s.ok());
        if (s->valid()) server = std::move(s).value();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(server.valid());
    bool done = false;
    for (int i = 0; i < 1000 && !done; ++i) {
        ASSERT_TRUE(finish_connect(client->get(), *bound, &done).ok());
    }
    ASSERT_TRUE(done);
    ASSERT_TRUE(set_nodelay(client->get()).ok());
    ASSERT_TRUE(set_dead_peer_timeout(client->get(), 5000).ok());

    // Nothing to read yet: 0 bytes, not EOF.
    char buf[16];
    bool eof = true;
    auto n = recv_some(server.get(), buf, sizeof(buf), &eof);
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(*n, 0u);
    EXPECT_FALSE(eof);

    const char msg[] = "hello";
    iovec iov{const_cast<char*>(msg), 5};
    auto sent = send_some(client->get(), &iov, 1);
    ASSERT_TRUE(sent.ok());
    EXPECT_EQ(*sent, 5u);
    size_t got = 0;
    for (int i = 0; i < 1000 && got < 5; ++i) {
        auto r = recv_some(server.get(), buf + got, sizeof(buf) - got, &eof);
        ASSERT_TRUE(r.ok());
        got += *r;
    }
    EXPECT_EQ(std::string(buf, got), "hello");

    client->reset();  // close: the server sees EOF
    bool saw_eof = false;
    for (int i = 0; i < 1000 && !saw_eof; ++i) {
        auto r = recv_some(server.get(), buf, sizeof(buf), &saw_eof);
        ASSERT_TRUE(r.ok());
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_TRUE(saw_eof);
    // Writing to a closed peer is an error, not a SIGPIPE.
    Status st;
    for (int i = 0; i < 100 && st.ok(); ++i) {
        auto w = send_some(server.get(), &iov, 1);
        st = w.ok() ? Status() : w.status();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
}

// Under ASan, send_some checks the bytes before the syscall and calls it uncaught (socket.cc says
// why): a send from memory the program may not read must still be reported.
TEST(Sockets, ASendFromMemoryNotToBeReadIsReportedUnderAddressSanitizer) {
    if (!testing::kUnderAddressSanitizer) GTEST_SKIP() << "not an AddressSanitizer build";
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    int fds[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    Fd a(fds[0]), b(fds[1]);
    std::vector<char> buf(4096, 'x');
    iovec iov[2] = {{buf.data(), 1024}, {buf.data() + 2048, 1024}};
    auto sent = send_some(a.get(), iov, 2);  // readable: sent
    ASSERT_TRUE(sent.ok());
    EXPECT_EQ(*sent, 2048u);
    ASAN_POISON_MEMORY_REGION(buf.data() + 3000, 8);
    EXPECT_DEATH((void)send_some(a.get(), iov, 2), "use-after-poison");
    ASAN_UNPOISON_MEMORY_REGION(buf.data() + 3000, 8);
}

TEST(Sockets, ConnectRefusedIsUnavailable) {
    auto addr = SocketAddress::parse("127.0.0.1", 0);
    auto listener = listen_tcp(*addr, 1);
    auto bound = local_address(listener->get());
    listener->reset();  // nobody listens there now
    auto fd = connect_blocking(*bound, 2000);
    ASSERT_FALSE(fd.ok());
    EXPECT_EQ(fd.status().code(), StatusCode::kUnavailable) << fd.status().to_string();
}

// Whether the other end closed `fd` within a second (EOF or reset).
bool closed_by_other_end(int fd) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 1000) <= 0) return false;
    char c;
    return ::recv(fd, &c, 1, 0) <= 0;
}

// Sets a test budget and puts the environment's back at the end of the test.
struct TestBudget {
    explicit TestBudget(uint64_t budget) { set_socket_budget_for_testing(budget); }
    ~TestBudget() { set_socket_budget_for_testing(0); }
};

TEST(SocketBudget, EverySocketOpenedCountsOnceUntilItCloses) {
    const uint64_t base = sockets_open();
    auto listener = listen_tcp(*SocketAddress::parse("127.0.0.1", 0), 16);
    ASSERT_TRUE(listener.ok());
    EXPECT_EQ(sockets_open(), base + 1);
    const SocketAddress bound = *local_address(listener->get());
    auto client = connect_blocking(bound, 5000);
    ASSERT_TRUE(client.ok()) << client.status().to_string();
    EXPECT_EQ(sockets_open(), base + 2);
    Fd server;
    for (int i = 0; i < 1000 && !server.valid(); ++i) {
        auto s = accept_tcp(listener->get(), nullptr);
        ASSERT_TRUE(s.ok()) << s.status().to_string();
        if (s->valid()) server = std::move(s).value();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(server.valid());
    EXPECT_EQ(sockets_open(), base + 3);
    // Moves carry the place; only the last holder gives it back.
    Fd moved = std::move(server);
    EXPECT_FALSE(server.valid());
    Fd assigned;
    assigned = std::move(moved);
    EXPECT_EQ(sockets_open(), base + 3);
    // Released: the caller's, out of the budget.
    const int raw = assigned.release();
    EXPECT_EQ(sockets_open(), base + 2);
    ::close(raw);
    // Reset: closed, and an fd held afterwards is not counted.
    client->reset(::dup(STDERR_FILENO));
    EXPECT_EQ(sockets_open(), base + 1);
    client->reset();
    EXPECT_EQ(sockets_open(), base + 1);
    listener->reset();
    EXPECT_EQ(sockets_open(), base);
    // Nothing opened through a socket call that failed is counted.
    auto refused = listen_tcp(*SocketAddress::parse("192.0.2.1", 0), 16);  // not ours: bind fails
    EXPECT_FALSE(refused.ok());
    EXPECT_EQ(sockets_open(), base);
}

// Registrations that hold a descriptor (an external plugin's GPU ones) share the budget with
// the sockets: a place taken for one is a socket fewer, and the other way round.
TEST(SocketBudget, RegistrationPlacesShareTheBudgetWithSockets) {
    const uint64_t base = budget_used();
    TestBudget budget(base + 2);
    ASSERT_TRUE(take_registration_place("test").ok());
    EXPECT_EQ(budget_used(), base + 1);
    auto listener = listen_tcp(*SocketAddress::parse("127.0.0.1", 0), 16);
    ASSERT_TRUE(listener.ok());
    EXPECT_TRUE(socket_budget_full());
    const Status no_place = take_registration_place("registering");
    EXPECT_EQ(no_place.code(), StatusCode::kResourceExhausted);
    EXPECT_NE(no_place.message().find("1 GPU registrations"), std::string::npos)
        << no_place.to_string();
    auto refused = listen_tcp(*SocketAddress::parse("127.0.0.1", 0), 16);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("TCP sockets open and 1 GPU registrations"),
              std::string::npos)
        << refused.status().to_string();
    give_back_registration_place();
    EXPECT_FALSE(socket_budget_full());
    auto another = listen_tcp(*SocketAddress::parse("127.0.0.1", 0), 16);
    EXPECT_TRUE(another.ok());
    another->reset();
    listener->reset();
    EXPECT_EQ(budget_used(), base);
}

TEST(SocketBudget, PastTheBudgetNothingOpensAndAcceptedConnectionsAreClosed) {
    const uint64_t base = sockets_open();
    TestBudget budget(base + 2);
    auto listener = listen_tcp(*SocketAddress::parse("127.0.0.1", 0), 16);
    ASSERT_TRUE(listener.ok());
    const SocketAddress bound = *local_address(listener->get());
    auto client = listen_tcp(*SocketAddress::parse("127.0.0.1", 0), 16);  // another socket held
    ASSERT_TRUE(client.ok());
    EXPECT_TRUE(socket_budget_full());
    // Full: a connect and a listener are refused with the bound named.
    auto more = start_connect(bound);
    ASSERT_FALSE(more.ok());
    EXPECT_EQ(more.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(more.status().message().find("TCP sockets open"), std::string::npos)
        << more.status().to_string();
    auto other = listen_tcp(*SocketAddress::parse("127.0.0.1", 0), 16);
    ASSERT_FALSE(other.ok());
    EXPECT_EQ(other.status().code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(sockets_open(), base + 2);
    // A connection that arrives is not taken: it waits in the kernel's queue, open.
    const int stranger = testing::plain_connect(bound);
    ASSERT_GE(stranger, 0);
    for (int i = 0; i < 1000 && !connection_waiting(listener->get()); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(connection_waiting(listener->get()));
    auto refused_accept = accept_tcp(listener->get(), nullptr);
    ASSERT_FALSE(refused_accept.ok());
    EXPECT_EQ(refused_accept.status().code(), StatusCode::kResourceExhausted);
    EXPECT_TRUE(connection_waiting(listener->get()));
    EXPECT_FALSE(closed_by_other_end(stranger));
    EXPECT_EQ(sockets_open(), base + 2);
    // Room for several at once, or not.
    EXPECT_EQ(socket_budget_room(1, "test").code(), StatusCode::kResourceExhausted);
    // A place given back is a place to take: the same connection.
    client->reset();
    EXPECT_FALSE(socket_budget_full());
    EXPECT_TRUE(socket_budget_room(1, "test").ok());
    EXPECT_FALSE(socket_budget_room(2, "test").ok());
    auto taken = accept_tcp(listener->get(), nullptr);
    ASSERT_TRUE(taken.ok()) << taken.status().to_string();
    ASSERT_TRUE(taken->valid());
    EXPECT_EQ(sockets_open(), base + 2);
    const char byte = 7;
    ASSERT_EQ(::send(stranger, &byte, 1, MSG_NOSIGNAL), 1);
    char got = 0;
    bool eof = false;
    for (int i = 0; i < 1000 && got == 0; ++i) {
        auto n = recv_some(taken->get(), &got, 1, &eof);
        ASSERT_TRUE(n.ok());
        if (*n == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(got, 7);
    ::close(stranger);
    // Nothing waiting: no place is held for it.
    auto none = accept_tcp(listener->get(), nullptr);
    ASSERT_FALSE(none.ok());  // (full again: the accepted one holds the place)
    taken->reset();
    none = accept_tcp(listener->get(), nullptr);
    ASSERT_TRUE(none.ok());
    EXPECT_FALSE(none->valid());
    EXPECT_EQ(sockets_open(), base + 1);
}

TEST(SocketBudget, AutomaticIsThreeQuartersOfTheOpenFilesLimitReadAtEachCheck) {
    if (std::getenv("TCPX_P2P_MAX_SOCKETS") != nullptr) {
        GTEST_SKIP() << "TCPX_P2P_MAX_SOCKETS is set in the environment";
    }
    rlimit saved{};
    ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
    if (saved.rlim_cur != RLIM_INFINITY && saved.rlim_cur < 1000) {
        GTEST_SKIP() << "the open-files limit is " << saved.rlim_cur;
    }
    rlimit lower = saved;
    lower.rlim_cur = 1000;
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &lower), 0);
    EXPECT_EQ(socket_budget(), 750u);
    lower.rlim_cur = 400;
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &lower), 0);
    EXPECT_EQ(socket_budget(), 300u);
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
    {
        auto held = listen_tcp(*SocketAddress::parse("127.0.0.1", 0), 16);
        ASSERT_TRUE(held.ok());
        TestBudget budget(sockets_open());
        auto refused = listen_tcp(*SocketAddress::parse("127.0.0.1", 0), 16);
        ASSERT_FALSE(refused.ok());
        EXPECT_NE(refused.status().message().find("a test's budget"), std::string::npos)
            << refused.status().to_string();
    }
    if (sockets_open() < 300) {
        lower.rlim_cur = 400;
        ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &lower), 0);
        // Filled up to the automatic bound: the error says what to raise.
        std::vector<Fd> held;
        StatusOr<Fd> next = Fd();
        while ((next = listen_tcp(*SocketAddress::parse("127.0.0.1", 0), 1)).ok()) {
            held.push_back(std::move(next).value());
        }
        EXPECT_EQ(sockets_open(), 300u);
        EXPECT_EQ(next.status().code(), StatusCode::kResourceExhausted);
        EXPECT_NE(next.status().message().find("ulimit -n"), std::string::npos)
            << next.status().to_string();
        held.clear();
        ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
    }
}

}  // namespace
}  // namespace tcpx
