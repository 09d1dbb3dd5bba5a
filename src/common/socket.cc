#include "common/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>

#include "common/env.h"
#include "common/params.h"
#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx {

// --- the socket budget -----------------------------------------------------------------------

namespace {

std::atomic<uint64_t> g_sockets_open{0};
std::atomic<uint64_t> g_registrations{0};  // registrations holding a descriptor (socket.h)
std::atomic<uint64_t> g_budget_for_testing{0};
constexpr int64_t kBudgetUnread = -1;
std::atomic<int64_t> g_max_sockets_env{kBudgetUnread};

// TCPX_P2P_MAX_SOCKETS, through the parameter table, once. An invalid value is 0 (automatic)
// here; Config::from_env() reports it as an error where an endpoint is made.
int64_t max_sockets_setting() {
    int64_t value = g_max_sockets_env.load(std::memory_order_relaxed);
    if (value != kBudgetUnread) return value;
    Settings settings;
    const std::string env_name = std::string(kEnvPrefix) + "MAX_SOCKETS";
    int64_t read = 0;
    if (const auto text = env_get(env_name.c_str());
        text.has_value() && settings.set("MAX_SOCKETS", *text).ok()) {
        read = settings.max_sockets;
    }
    int64_t expected = kBudgetUnread;
    g_max_sockets_env.compare_exchange_strong(expected, read);
    return g_max_sockets_env.load();
}

// Three quarters of the soft open-files limit: the rest stays the application's (its files,
// its own sockets, a plugin's). An unlimited or unreadable limit counts as 2^20, the kernel's
// default ceiling (fs.nr_open).
uint64_t automatic_budget() {
    constexpr uint64_t kUnlimited = uint64_t{1} << 20;
    rlimit lim{};
    uint64_t files = kUnlimited;
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
        files = std::min<uint64_t>(lim.rlim_cur, kUnlimited);
    }
    return std::max<uint64_t>(files / 4 * 3, 1);
}

std::string budget_words() {
    const uint64_t testing = g_budget_for_testing.load(std::memory_order_relaxed);
    if (testing != 0) return strformat("a test's budget of %llu", (unsigned long long)testing);
    if (const int64_t set = max_sockets_setting(); set > 0) {
        return strformat("TCPX_P2P_MAX_SOCKETS=%lld", static_cast<long long>(set));
    }
    rlimit lim{};
    const bool read = ::getrlimit(RLIMIT_NOFILE, &lim) == 0;
    return strformat(
        "TCPX_P2P_MAX_SOCKETS automatic: %llu, three quarters of the open-files "
        "limit %s; raise it (ulimit -n) or set the variable",
        static_cast<unsigned long long>(automatic_budget()),
        !read                           ? "(unreadable)"
        : lim.rlim_cur == RLIM_INFINITY ? "(unlimited)"
                                        : std::to_string(lim.rlim_cur).c_str());
}

}  // namespace

std::string budget_use_words() {
    std::string out =
        strformat("%llu TCP sockets open", static_cast<unsigned long long>(sockets_open()));
    if (const uint64_t regs = g_registrations.load(std::memory_order_relaxed); regs > 0) {
        out += strformat(" and %llu GPU registrations of the ncclNet plugin (a descriptor each)",
                         static_cast<unsigned long long>(regs));
    }
    return out;
}

uint64_t sockets_open() { return g_sockets_open.load(std::memory_order_relaxed); }

uint64_t registrations_held() { return g_registrations.load(std::memory_order_relaxed); }

uint64_t socket_budget() {
    if (const uint64_t testing = g_budget_for_testing.load(std::memory_order_relaxed);
        testing != 0) {
        return testing;
    }
    if (const int64_t set = max_sockets_setting(); set > 0) return static_cast<uint64_t>(set);
    return automatic_budget();
}

void set_socket_budget_for_testing(uint64_t budget) { g_budget_for_testing.store(budget); }

Status socket_budget_room(uint64_t count, const char* what) {
    if (budget_used() + count <= socket_budget()) return Status();
    return resource_exhausted(
        strformat("%s: %llu TCP sockets needed, %s, the most this "
                  "process gives tcpx-p2p (%s)",
                  what, static_cast<unsigned long long>(count), budget_use_words().c_str(),
                  budget_words().c_str()));
}

Status take_registration_place(const char* what) {
    const uint64_t budget = socket_budget();
    uint64_t regs = g_registrations.load(std::memory_order_relaxed);
    do {
        if (sockets_open() + regs >= budget) {
            return resource_exhausted(
                strformat("%s: %s, the most descriptors this process gives tcpx-p2p (%s)", what,
                          budget_use_words().c_str(), budget_words().c_str()));
        }
    } while (!g_registrations.compare_exchange_weak(regs, regs + 1, std::memory_order_relaxed));
    return Status();
}

void give_back_registration_place() { g_registrations.fetch_sub(1, std::memory_order_relaxed); }

namespace {
std::atomic<int64_t> g_room_wanted_ns{0};  // steady clock, when a listener last wanted room
int64_t steady_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}
}  // namespace

void note_room_wanted() { g_room_wanted_ns.store(steady_ns(), std::memory_order_relaxed); }

bool room_wanted() {
    const int64_t at = g_room_wanted_ns.load(std::memory_order_relaxed);
    return at != 0 && steady_ns() - at < 1'000'000'000;
}

struct SocketBudgetAccess {
    // A place in the budget for one socket, taken before it exists.
    static Status take(const char* what) {
        const uint64_t budget = socket_budget();
        uint64_t open = g_sockets_open.load(std::memory_order_relaxed);
        do {
            if (open + registrations_held() >= budget) {
                return resource_exhausted(
                    strformat("%s: %s, the most this process gives tcpx-p2p (%s)", what,
                              budget_use_words().c_str(), budget_words().c_str()));
            }
        } while (!g_sockets_open.compare_exchange_weak(open, open + 1, std::memory_order_relaxed));
        return Status();
    }
    static void give_back() { g_sockets_open.fetch_sub(1, std::memory_order_relaxed); }
    // `fd` holds the place taken for it; a failed socket() (-1) gives it back.
    static Fd counted(int fd) {
        Fd out(fd);
        if (fd >= 0) {
            out.counted_ = true;
        } else {
            give_back();
        }
        return out;
    }
};

int Fd::release() {
    if (counted_) SocketBudgetAccess::give_back();
    counted_ = false;
    const int fd = fd_;
    fd_ = -1;
    return fd;
}

void Fd::reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    if (counted_) SocketBudgetAccess::give_back();
    counted_ = false;
    fd_ = fd;
}

bool parse_address_family(std::string_view text, AddressFamily* family) {
    text = trim(text);
    if (text == "any") {
        *family = AddressFamily::kAny;
    } else if (text == "ipv4") {
        *family = AddressFamily::kIPv4;
    } else if (text == "ipv6") {
        *family = AddressFamily::kIPv6;
    } else {
        return false;
    }
    return true;
}

// --- SocketAddress -------------------------------------------------------------------------------

StatusOr<SocketAddress> SocketAddress::parse(std::string_view host, uint16_t port) {
    std::string h(trim(host));
    if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    const std::string service = std::to_string(port);
    const int rc = ::getaddrinfo(h.c_str(), service.c_str(), &hints, &res);
    if (rc != 0 || res == nullptr) {
        return invalid_argument(strformat("'%s' is not a numeric IPv4 or IPv6 address: %s",
                                          h.c_str(), ::gai_strerror(rc)));
    }
    auto out = from_sockaddr(res->ai_addr, res->ai_addrlen);
    ::freeaddrinfo(res);
    return out;
}

StatusOr<SocketAddress> SocketAddress::from_sockaddr(const sockaddr* addr, socklen_t len) {
    SocketAddress out;
    if (addr == nullptr) return invalid_argument("null socket address");
    if (addr->sa_family == AF_INET && len >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
        out.len_ = sizeof(sockaddr_in);
    } else if (addr->sa_family == AF_INET6 && len >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
        out.len_ = sizeof(sockaddr_in6);
    } else {
        return invalid_argument(strformat("unsupported address family %d", addr->sa_family));
    }
    std::memcpy(&out.storage_, addr, out.len_);
    return out;
}

uint16_t SocketAddress::port() const {
    if (family() == AF_INET)
        return ntohs(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_port);
    if (family() == AF_INET6) {
        return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_port);
    }
    return 0;
}

void SocketAddress::set_port(uint16_t port) {
    if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage_)->sin_port = htons(port);
    if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage_)->sin6_port = htons(port);
}

bool SocketAddress::is_loopback() const {
    if (family() == AF_INET) {
        const uint32_t a = ntohl(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr.s_addr);
        return (a >> 24) == 127;
    }
    if (family() == AF_INET6) {
        return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr);
    }
    return false;
}

bool SocketAddress::is_link_local() const {
    return family() == AF_INET6 &&
           IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr);
}

uint32_t SocketAddress::scope_id() const {
    return family() == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_scope_id
                                : 0;
}

namespace {

// The 16 bytes of an IPv6 address, IPv4 addresses as IPv4-mapped; false for other families.
bool host_bytes(const sockaddr_storage& ss, in6_addr* out) {
    if (ss.ss_family == AF_INET) {
        std::memset(out, 0, sizeof(*out));
        out->s6_addr[10] = 0xff;
        out->s6_addr[11] = 0xff;
        std::memcpy(&out->s6_addr[12], &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, 4);
        return true;
    }
    if (ss.ss_family == AF_INET6) {
        *out = reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr;
        return true;
    }
    return false;
}

}  // namespace

bool SocketAddress::same_host(const SocketAddress& other) const {
    in6_addr a;
    in6_addr b;
    return host_bytes(storage_, &a) && host_bytes(other.storage_, &b) &&
           std::memcmp(&a, &b, sizeof(a)) == 0;
}

std::string SocketAddress::host_string() const {
    char host[NI_MAXHOST];
    if (len_ == 0 ||
        ::getnameinfo(get(), len_, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) {
        return "(none)";
    }
    return host;
}

std::string SocketAddress::to_string() const {
    if (len_ == 0) return "(none)";
    if (family() == AF_INET6) return "[" + host_string() + "]:" + std::to_string(port());
    return host_string() + ":" + std::to_string(port());
}

// --- interfaces ----------------------------------------------------------------------------------

bool interface_matches(std::string_view spec, std::string_view name) {
    spec = trim(spec);
    bool exclude = false;
    bool exact = false;
    if (!spec.empty() && spec.front() == '^') {
        exclude = true;
        spec.remove_prefix(1);
    }
    if (!spec.empty() && spec.front() == '=') {
        exact = true;
        spec.remove_prefix(1);
    }
    bool listed = false;
    for (const std::string& entry : split_trimmed(spec, ',')) {
        if (exact ? name == entry : name.substr(0, entry.size()) == entry) {
            listed = true;
            break;
        }
    }
    return exclude ? !listed : listed;
}

namespace {

bool family_allowed(int fam, AddressFamily family) {
    if (fam == AF_INET) return family != AddressFamily::kIPv6;
    if (fam == AF_INET6) return family != AddressFamily::kIPv4;
    return false;
}

// Lower is preferred: IPv4, then global IPv6, then link-local IPv6.
int address_rank(const sockaddr* sa) {
    if (sa->sa_family == AF_INET) return 0;
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    return IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr) ? 2 : 1;
}

}  // namespace

bool is_own_address(const SocketAddress& addr) {
    if (addr.is_loopback()) return true;
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) return false;
    bool found = false;
    for (ifaddrs* it = list; it != nullptr && !found; it = it->ifa_next) {
        if (it->ifa_addr == nullptr) continue;
        const int family = it->ifa_addr->sa_family;
        if (family != AF_INET && family != AF_INET6) continue;
        auto own = SocketAddress::from_sockaddr(
            it->ifa_addr, family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
        found = own.ok() && own->same_host(addr);
    }
    ::freeifaddrs(list);
    return found;
}

bool names_peer_host(const SocketAddress& named, const SocketAddress& peer) {
    if (named.same_host(peer)) return true;
    // Another loopback address than the peer's own is not one of its interfaces.
    return peer.is_loopback() && !named.is_loopback() && is_own_address(named);
}

StatusOr<std::vector<NetInterface>> find_interfaces(std::string_view spec, AddressFamily family) {
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) return errno_status(errno, "getifaddrs");

    struct Candidate {
        NetInterface iface;
        int rank;
    };
    std::vector<Candidate> found;
    auto collect = [&](auto&& selected) {
        found.clear();
        for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
            if (it->ifa_addr == nullptr || !(it->ifa_flags & IFF_UP)) continue;
            if (!family_allowed(it->ifa_addr->sa_family, family)) continue;
            if (!selected(std::string_view(it->ifa_name))) continue;
            const socklen_t len =
                it->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
            auto addr = SocketAddress::from_sockaddr(it->ifa_addr, len);
            if (!addr.ok()) continue;
            const int rank = address_rank(it->ifa_addr);
            auto same = std::find_if(found.begin(), found.end(), [&](const Candidate& c) {
                return c.iface.name == it->ifa_name;
            });
            if (same == found.end()) {
                found.push_back(
                    Candidate{NetInterface{it->ifa_name, *addr,
                                           static_cast<int>(::if_nametoindex(it->ifa_name))},
                              rank});
            } else if (rank < same->rank) {
                same->iface.address = *addr;
                same->rank = rank;
            }
        }
    };

    if (!trim(spec).empty()) {
        collect([&](std::string_view name) { return interface_matches(spec, name); });
    } else {
        collect(
            [](std::string_view name) { return name != "lo" && name.substr(0, 6) != "docker"; });
        if (found.empty()) collect([](std::string_view name) { return name == "lo"; });
    }
    ::freeifaddrs(list);

    if (found.empty()) {
        return not_found(strformat("no interface that is up with an %s address matches '%.*s'",
                                   family == AddressFamily::kIPv4   ? "IPv4"
                                   : family == AddressFamily::kIPv6 ? "IPv6"
                                                                    : "IP",
                                   static_cast<int>(spec.size()), spec.data()));
    }
    std::vector<NetInterface> out;
    out.reserve(found.size());
    for (Candidate& c : found) out.push_back(std::move(c.iface));
    return out;
}

// --- socket operations ---------------------------------------------------------------------------

StatusOr<Fd> listen_tcp(const SocketAddress& addr, int backlog) {
    TCPX_RETURN_IF_ERROR(SocketBudgetAccess::take("listen"));
    Fd fd = SocketBudgetAccess::counted(
        ::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return errno_status(errno, "socket");
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), addr.get(), addr.size()) != 0) {
        return errno_status(errno, "bind " + addr.to_string());
    }
    if (::listen(fd.get(), backlog) != 0) return errno_status(errno, "listen " + addr.to_string());
    return fd;
}

StatusOr<SocketAddress> local_address(int fd) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
        return errno_status(errno, "getsockname");
    }
    return SocketAddress::from_sockaddr(reinterpret_cast<sockaddr*>(&ss), len);
}

StatusOr<SocketAddress> peer_address(int fd) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
        return errno_status(errno, "getpeername");
    }
    return SocketAddress::from_sockaddr(reinterpret_cast<sockaddr*>(&ss), len);
}

StatusOr<Fd> start_connect(const SocketAddress& addr, const SocketAddress* source) {
    TCPX_RETURN_IF_ERROR(SocketBudgetAccess::take(("connect to " + addr.to_string()).c_str()));
    Fd fd = SocketBudgetAccess::counted(
        ::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return errno_status(errno, "socket");
    if (source != nullptr && source->family() == addr.family()) {
        if (::bind(fd.get(), source->get(), source->size()) != 0) {
            return errno_status(errno, "bind to " + source->to_string());
        }
    }
    if (::connect(fd.get(), addr.get(), addr.size()) != 0 && errno != EINPROGRESS) {
        return errno_status(errno, "connect to " + addr.to_string());
    }
    return fd;
}

Status finish_connect(int fd, const SocketAddress& addr, bool* done) {
    *done = false;
    pollfd pfd{fd, POLLOUT, 0};
    const int rc = ::poll(&pfd, 1, 0);
    if (rc < 0) return errno_status(errno, "poll");
    if (rc == 0) return Status();
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
        return errno_status(errno, "getsockopt(SO_ERROR)");
    }
    if (err != 0) return errno_status(err, "connect to " + addr.to_string());
    *done = true;
    return Status();
}

StatusOr<Fd> connect_blocking(const SocketAddress& addr, int timeout_ms) {
    TCPX_ASSIGN_OR_RETURN(Fd fd, start_connect(addr));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
        pollfd pfd{fd.get(), POLLOUT, 0};
        ::poll(&pfd, 1, 50);
        bool done = false;
        TCPX_RETURN_IF_ERROR(finish_connect(fd.get(), addr, &done));
        if (done) break;
        if (std::chrono::steady_clock::now() > deadline) {
            return timeout_error("connect to " + addr.to_string() + " timed out");
        }
    }
    TCPX_RETURN_IF_ERROR(set_nonblocking(fd.get(), false));
    return fd;
}

StatusOr<Fd> accept_tcp(int listen_fd, SocketAddress* peer) {
    // The place is taken before the connection: one taken off the kernel's queue is never
    // closed for want of room (it may be a real peer's, whose comm would stay incomplete).
    TCPX_RETURN_IF_ERROR(SocketBudgetAccess::take("accept"));
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int fd = -1;
    while (true) {
        len = sizeof(ss);
        fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) break;
        const int err = errno;
        if (err == ECONNABORTED || err == EPROTO) {
            // A connection that was reset while queued is not an error of the listener, nor the
            // end of the queue (an empty Fd would tell the caller nothing is left): the next one
            // is taken. Each such error took one connection off the queue, so this ends.
            continue;
        }
        SocketBudgetAccess::give_back();
        if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) return Fd();
        // Not (or no longer) listening: shut down (V7Net::end_parked_accepts_locked does so to
        // the emulated plugin's listener). The listener's end, not a passing shortage.
        if (err == EINVAL) return failed_precondition("accept: the socket is not listening");
        return errno_status(err, "accept");
    }
    if (peer != nullptr) {
        auto addr = SocketAddress::from_sockaddr(reinterpret_cast<sockaddr*>(&ss), len);
        if (addr.ok()) *peer = *addr;
    }
    return SocketBudgetAccess::counted(fd);
}

bool connection_waiting(int listen_fd) {
    pollfd pfd{listen_fd, POLLIN, 0};
    return ::poll(&pfd, 1, 0) > 0 && (pfd.revents & POLLIN) != 0;
}

Status set_nonblocking(int fd, bool nonblocking) {
    const int flags = ::fcntl(fd, F_GETFL, 0);
    if (flags < 0) return errno_status(errno, "fcntl(F_GETFL)");
    const int want = nonblocking ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
    if (want != flags && ::fcntl(fd, F_SETFL, want) != 0) {
        return errno_status(errno, "fcntl(F_SETFL)");
    }
    return Status();
}

Status set_nodelay(int fd) {
    const int one = 1;
    if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
        return errno_status(errno, "setsockopt(TCP_NODELAY)");
    }
    return Status();
}

Status set_buffer_sizes(int fd, uint64_t sndbuf, uint64_t rcvbuf) {
    auto set = [fd](int opt, uint64_t bytes, const char* name) -> Status {
        if (bytes == 0) return Status();
        const int v = static_cast<int>(std::min<uint64_t>(bytes, std::numeric_limits<int>::max()));
        if (::setsockopt(fd, SOL_SOCKET, opt, &v, sizeof(v)) != 0) {
            return errno_status(errno, strformat("setsockopt(%s, %d)", name, v));
        }
        return Status();
    };
    TCPX_RETURN_IF_ERROR(set(SO_SNDBUF, sndbuf, "SO_SNDBUF"));
    return set(SO_RCVBUF, rcvbuf, "SO_RCVBUF");
}

Status set_dead_peer_timeout(int fd, int64_t timeout_ms) {
    if (timeout_ms <= 0) return Status();
    const unsigned user_timeout =
        static_cast<unsigned>(std::min<int64_t>(timeout_ms, std::numeric_limits<unsigned>::max()));
    if (::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout)) != 0) {
        return errno_status(errno, "setsockopt(TCP_USER_TIMEOUT)");
    }
    // Keepalive finds a dead peer on an idle connection: first probe after a third of the
    // timeout, then probes every sixth, so about three unanswered probes fail it.
    const int one = 1;
    const int idle = static_cast<int>(std::max<int64_t>(1, timeout_ms / 3000));
    const int interval = static_cast<int>(std::max<int64_t>(1, timeout_ms / 6000));
    const int count = 3;
    if (::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)) != 0 ||
        ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) != 0 ||
        ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval)) != 0 ||
        ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count)) != 0) {
        return errno_status(errno, "setsockopt(keepalive)");
    }
    return Status();
}

// --- what the kernel orders and the sanitizers cannot see ---------------------------------------
//
// The sanitizers' sendmsg runs the syscall first and looks at the message's bytes after it. By
// then the kernel has copied them, and the receiver may have seen them and completed an operation
// on them: when target and initiator share a process (the tests), the memory may already be
// rewritten or freed. Both tools then report what the kernel rules out:
// - TSan: its sendmsg releases the socket's sync object (one for every socket of the process)
//   before the call and marks the bytes read after it. A receiver (its recv acquires that object)
//   is ordered after everything the sender did before the send but not after that read: a race
//   with the test rewriting the target's memory once a READ completes.
// - ASan: the bytes are checked after the call, by a thread the scheduler may have set aside for
//   milliseconds: a use after free when the test has freed the target's buffer meanwhile (seen in
//   CI with socket I/O threads, on a loaded machine).
// So under either, a send is what it is: the buffer's bytes checked (TSan: read) before the call,
// then the syscall itself, not intercepted, so that nothing is recorded after the bytes left.
// Other builds call sendmsg and nothing else.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TCPX_SOCKET_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define TCPX_SOCKET_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_read_range(void* addr, unsigned long size);
namespace {
ssize_t sendmsg_ordered(int fd, const msghdr* msg, int flags) {
    for (size_t i = 0; i < msg->msg_iovlen; ++i) {
        __tsan_read_range(msg->msg_iov[i].iov_base, msg->msg_iov[i].iov_len);
    }
    // (the release: an intercepted send of no bytes)
    (void)::send(fd, nullptr, 0, MSG_NOSIGNAL | MSG_DONTWAIT);
    return ::syscall(SYS_sendmsg, fd, msg, flags);
}
}  // namespace
#elif defined(TCPX_SOCKET_ASAN)
extern "C" void* __asan_region_is_poisoned(void* beg, size_t size);
namespace {
ssize_t sendmsg_ordered(int fd, const msghdr* msg, int flags) {
    for (size_t i = 0; i < msg->msg_iovlen; ++i) {
        void* bad = __asan_region_is_poisoned(msg->msg_iov[i].iov_base, msg->msg_iov[i].iov_len);
        // An instrumented load of the first bad byte: ASan's usual report, with this stack.
        if (bad != nullptr) (void)*static_cast<volatile const uint8_t*>(bad);
    }
    return ::syscall(SYS_sendmsg, fd, msg, flags);
}
}  // namespace
#else
namespace {
ssize_t sendmsg_ordered(int fd, const msghdr* msg, int flags) { return ::sendmsg(fd, msg, flags); }
}  // namespace
#endif

StatusOr<size_t> send_some(int fd, const iovec* iov, int iovcnt) {
    msghdr msg{};
    msg.msg_iov = const_cast<iovec*>(iov);
    msg.msg_iovlen = static_cast<size_t>(iovcnt);
    while (true) {
        const ssize_t n = sendmsg_ordered(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n >= 0) return static_cast<size_t>(n);
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
        return errno_status(errno, "send");
    }
}

StatusOr<size_t> recv_some(int fd, void* buf, size_t len, bool* eof) {
    *eof = false;
    while (true) {
        const ssize_t n = ::recv(fd, buf, len, MSG_DONTWAIT);
        if (n > 0) return static_cast<size_t>(n);
        if (n == 0) {
            *eof = len > 0;
            return size_t{0};
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
        return errno_status(errno, "recv");
    }
}

StatusOr<size_t> recv_some_iov(int fd, const iovec* iov, int iovcnt, bool* eof) {
    *eof = false;
    msghdr msg{};
    msg.msg_iov = const_cast<iovec*>(iov);
    msg.msg_iovlen = static_cast<size_t>(iovcnt);
    while (true) {
        const ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT);
        if (n > 0) return static_cast<size_t>(n);
        if (n == 0) {
            *eof = true;
            return size_t{0};
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
        return errno_status(errno, "recv");
    }
}

Status send_all(int fd, const void* buf, size_t len) {
    const auto* p = static_cast<const uint8_t*>(buf);
    while (len > 0) {
        iovec iov{const_cast<uint8_t*>(p), len};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        const ssize_t n = sendmsg_ordered(fd, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno_status(errno, "send");
        }
        p += n;
        len -= static_cast<size_t>(n);
    }
    return Status();
}

Status recv_all(int fd, void* buf, size_t len) {
    auto* p = static_cast<uint8_t*>(buf);
    while (len > 0) {
        const ssize_t n = ::recv(fd, p, len, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno_status(errno, "recv");
        }
        if (n == 0) return unavailable("connection closed by peer");
        p += n;
        len -= static_cast<size_t>(n);
    }
    return Status();
}

}  // namespace tcpx
