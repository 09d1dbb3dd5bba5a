// Socket helpers: an owning fd, addresses (IPv4 and IPv6), interface selection, and
// non-blocking operations that report partial progress instead of blocking.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tcpx/status.h"

namespace tcpx {

// Owns a file descriptor; closes it on destruction. A TCP socket opened by the functions below
// also holds a place in the process-wide socket budget (MAX_SOCKETS, see socket_budget()) until
// it is closed or released.
class Fd {
 public:
    Fd() = default;
    explicit Fd(int fd) : fd_(fd) {}
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    Fd(Fd&& other) noexcept : fd_(other.fd_), counted_(other.counted_) {
        other.fd_ = -1;
        other.counted_ = false;
    }
    Fd& operator=(Fd&& other) noexcept {
        if (this != &other) {
            reset();
            fd_ = other.fd_;
            counted_ = other.counted_;
            other.fd_ = -1;
            other.counted_ = false;
        }
        return *this;
    }
    ~Fd() { reset(); }

    int get() const { return fd_; }
    bool valid() const { return fd_ >= 0; }
    // Hands the descriptor to the caller, out of the socket budget.
    int release();
    // Closes the descriptor held (giving back its budget place) and holds `fd`, uncounted.
    void reset(int fd = -1);

 private:
    friend struct SocketBudgetAccess;  // socket.cc: the sockets it opens are counted
    int fd_ = -1;
    bool counted_ = false;
};

// The socket budget: every TCP socket the library opens (listening, connecting, accepted; its
// own transport's and its control connections, not those an external ncclNet plugin opens)
// counts, process-wide, against one bound, so that peers (strangers, where the port is open to
// them) cannot take the descriptors the application needs for its own files. Past it, opening
// a socket fails with RESOURCE_EXHAUSTED and a connection is not accepted (it stays in the
// kernel's queue). The bound is TCPX_P2P_MAX_SOCKETS, read from the environment at first use; 0
// (the default) is three quarters of the open-files limit (RLIMIT_NOFILE's soft value, read at each
// check, so that an application raising it raises the bound).
uint64_t sockets_open();
uint64_t socket_budget();
// Registrations that hold a descriptor of their own count against the same bound: an external
// ncclNet plugin's GPU registrations (Google's TCPX plugin keeps a dma-buf fd for each, per comm
// and registration window, so that peers naming more windows, or more peers, meant more
// descriptors with nothing bounding them). The plugin adapter takes a place before its regMr and
// gives it back at deregMr; past the budget the registration is refused (RESOURCE_EXHAUSTED),
// and the engine gives up registrations no request uses to make room.
uint64_t registrations_held();
// What the bound is checked against: sockets and such registrations together.
inline uint64_t budget_used() { return sockets_open() + registrations_held(); }
// "N TCP sockets open" and, where there are any, the registrations counted with them.
std::string budget_use_words();
// A listener that leaves a connection waiting for room in the budget says so
// (note_room_wanted); endpoints that hold registrations no request uses give them up on their
// next tick while room was wanted within the last second (room_wanted), whichever endpoint's
// listener it was.
void note_room_wanted();
bool room_wanted();
// A place for one registration (RESOURCE_EXHAUSTED naming `what` and the bound when none is
// left), and giving one back.
Status take_registration_place(const char* what);
void give_back_registration_place();
// Whether opening one more socket would be refused now. Listeners then leave new connections in
// the kernel's queue unless one of their own connections that has not proved itself can make
// way, and connections that have not proved themselves after kSocketBudgetGrace are closed by
// their owners: connections that never finish a handshake cannot keep the budget full for
// long, where a real peer's finish in a few round trips.
inline bool socket_budget_full() { return budget_used() >= socket_budget(); }
// Whether fewer than `headroom` places are left: an endpoint's listener takes no newcomer past
// that, so that a peer setting up its data channels finds its sockets' places.
inline bool socket_budget_pressed(uint64_t headroom) {
    return budget_used() + headroom >= socket_budget();
}
// OK when `count` more sockets fit now (a comm opens its sockets all at once), else
// RESOURCE_EXHAUSTED naming `what`, the bound and where it came from.
Status socket_budget_room(uint64_t count, const char* what);
inline constexpr std::chrono::milliseconds kSocketBudgetGrace{2000};
// A connection younger than this is not closed to make room: it has had no time to prove itself
// (a real peer's first message takes a round trip and a pass), and a flood of newcomers would
// otherwise push it out before it is read. Newcomers wait in the kernel's queue meanwhile.
inline constexpr std::chrono::milliseconds kSocketBudgetMinAge{200};
// Tests: a bound in place of MAX_SOCKETS (0: back to the environment's, or automatic).
void set_socket_budget_for_testing(uint64_t budget);

enum class AddressFamily { kAny, kIPv4, kIPv6 };

// Parses "any" / "ipv4" / "ipv6" (the SOCKET_FAMILY parameter).
bool parse_address_family(std::string_view text, AddressFamily* family);

// An IPv4 or IPv6 socket address.
class SocketAddress {
 public:
    SocketAddress() = default;
    // From a numeric host ("127.0.0.1", "::1", "fe80::1%eth0") and a port.
    static StatusOr<SocketAddress> parse(std::string_view host, uint16_t port);
    static StatusOr<SocketAddress> from_sockaddr(const sockaddr* addr, socklen_t len);

    int family() const { return storage_.ss_family; }
    uint16_t port() const;
    void set_port(uint16_t port);
    bool is_loopback() const;
    // An IPv6 link-local address (fe80::/10), which names a host only together with its link.
    bool is_link_local() const;
    // The IPv6 scope (interface index); 0 for IPv4.
    uint32_t scope_id() const;
    // Whether both name the same host address (ports aside); an IPv4-mapped IPv6 address
    // equals its IPv4 address.
    bool same_host(const SocketAddress& other) const;
    const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage_); }
    socklen_t size() const { return len_; }
    // "127.0.0.1:5000", "[::1]:5000"; "(none)" when empty.
    std::string to_string() const;
    // The host part alone: "127.0.0.1", "::1".
    std::string host_string() const;

 private:
    sockaddr_storage storage_{};
    socklen_t len_ = 0;
};

// Whether `addr` is an address of this host: loopback, or assigned to one of its interfaces.
bool is_own_address(const SocketAddress& addr);

// Whether a connection handle naming `named` may come from a peer whose control connection
// comes from `peer`: the same host address, or, for a peer on loopback (so on this host), any
// non-loopback address of this host (its data interfaces need not be loopback). Never a third
// host, nor another loopback address than the peer's.
bool names_peer_host(const SocketAddress& named, const SocketAddress& peer);

struct NetInterface {
    std::string name;       // "eth0"
    SocketAddress address;  // port 0
    int index = 0;          // if_nametoindex
};

// The interfaces selected by `spec` (the SOCKET_IFNAME syntax: comma-separated name prefixes,
// "^" excludes, "=" exact) that are up and have an address of `family`, in the order the system
// lists them, one entry per interface (its first matching address). With an empty spec: every
// interface except lo and docker*, or lo when there is no other. Error when nothing matches.
StatusOr<std::vector<NetInterface>> find_interfaces(std::string_view spec, AddressFamily family);

// Whether `name` is selected by `spec` (exposed for tests).
bool interface_matches(std::string_view spec, std::string_view name);

// A non-blocking, close-on-exec listening TCP socket bound to `addr` (port 0: ephemeral).
StatusOr<Fd> listen_tcp(const SocketAddress& addr, int backlog);
// The address a socket is bound to (with the port the kernel chose).
StatusOr<SocketAddress> local_address(int fd);
StatusOr<SocketAddress> peer_address(int fd);

// Starts a non-blocking connect; the returned fd completes later (poll for writability, then
// finish_connect).
// With `source` (not null, same family as `addr`), the socket is bound to that local address
// (port 0) first, so that its traffic leaves from that interface's address.
StatusOr<Fd> start_connect(const SocketAddress& addr, const SocketAddress* source = nullptr);
// Checks a connect started by start_connect: *done is false while in progress; an error status
// when it failed.
Status finish_connect(int fd, const SocketAddress& addr, bool* done);
// Blocking connect with a deadline, for tools and tests.
StatusOr<Fd> connect_blocking(const SocketAddress& addr, int timeout_ms);

// Accepts one pending connection as a non-blocking, close-on-exec fd; an invalid Fd when none is
// pending. `peer` may be null. At the socket budget nothing is accepted (the connection stays in
// the kernel's queue) and the result is RESOURCE_EXHAUSTED. A socket that is not listening (shut
// down) is FAILED_PRECONDITION.
StatusOr<Fd> accept_tcp(int listen_fd, SocketAddress* peer);
// Whether a connection waits in `listen_fd`'s queue (poll, no wait).
bool connection_waiting(int listen_fd);

Status set_nonblocking(int fd, bool nonblocking);
Status set_nodelay(int fd);
// 0 leaves a buffer size alone (the kernel autotunes it).
Status set_buffer_sizes(int fd, uint64_t sndbuf, uint64_t rcvbuf);
// Dead-peer detection: TCP_USER_TIMEOUT plus keepalive probes that together give up after about
// `timeout_ms`. 0 leaves the kernel's defaults.
Status set_dead_peer_timeout(int fd, int64_t timeout_ms);

// Non-blocking I/O with partial progress. Each returns the number of bytes moved, 0 when the
// call would block; recv_some sets *eof when the peer closed its side. Errors carry strerror.
// Sends never raise SIGPIPE.
StatusOr<size_t> send_some(int fd, const iovec* iov, int iovcnt);
StatusOr<size_t> recv_some(int fd, void* buf, size_t len, bool* eof);
StatusOr<size_t> recv_some_iov(int fd, const iovec* iov, int iovcnt, bool* eof);

// Blocking whole-buffer I/O for tools, tests and baselines (the fd must be blocking).
Status send_all(int fd, const void* buf, size_t len);
// Error on EOF before `len` bytes.
Status recv_all(int fd, void* buf, size_t len);

}  // namespace tcpx
