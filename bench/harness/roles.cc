#include "bench/harness/roles.h"

#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>

#include "bench/harness/report.h"
#include "common/params.h"
#include "common/status_util.h"
#include "common/strings.h"

extern char** environ;

namespace tcpx::bench {

// --- channels ----------------------------------------------------------------------------------

void LineQueue::push(std::string line) {
    std::lock_guard<std::mutex> lock(mu_);
    lines_.push_back(std::move(line));
    cv_.notify_one();
}

std::string LineQueue::pop() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !lines_.empty(); });
    std::string line = std::move(lines_.front());
    lines_.pop_front();
    return line;
}

bool LineQueue::wait(int ms) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return !lines_.empty(); });
}

bool QueueChannel::write_line(const std::string& line) {
    out_->push(line);
    return true;
}

bool QueueChannel::read_line(std::string* line) {
    *line = in_->pop();
    return true;
}

std::chrono::steady_clock::time_point FdChannel::line_deadline() const {
    return std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
}

bool FdChannel::wait_for(int fd, short events, std::chrono::steady_clock::time_point deadline) {
    if (timeout_ms_ < 0) return true;
    pollfd pfd{fd, events, 0};
    while (true) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(
                              deadline - std::chrono::steady_clock::now())
                              .count();
        const int rc = ::poll(&pfd, 1, static_cast<int>(std::max<int64_t>(left, 0)));
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) {
            why_ = std::string("poll: ") + std::strerror(errno);
            return false;
        }
        if (rc == 0) {
            // Nothing at all, or bytes that never made a whole line.
            why_ = (events & POLLIN) != 0 && !buffer_.empty()
                       ? strformat("no whole line in %.1f s", timeout_ms_ / 1000.0)
                       : strformat("no answer for %.1f s", timeout_ms_ / 1000.0);
            return false;
        }
        return true;
    }
}

bool FdChannel::write_line(const std::string& line) {
    const std::string data = line + "\n";
    const auto deadline = line_deadline();
    size_t off = 0;
    while (off < data.size()) {
        const char* p = data.data() + off;
        const size_t left = data.size() - off;
        ssize_t n = 0;
        if (timeout_ms_ < 0) {
            n = ::write(out_, p, left);
        } else {
            // Bounded: never block in the write itself. A socket takes what fits now; a pipe
            // ready for writing takes PIPE_BUF bytes without blocking.
            if (!wait_for(out_, POLLOUT, deadline)) return false;
            n = ::send(out_, p, left, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n < 0 && errno == ENOTSOCK) n = ::write(out_, p, std::min<size_t>(left, PIPE_BUF));
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        off += static_cast<size_t>(n);
    }
    return true;
}

bool FdChannel::wait_input(int ms) {
    if (expired_ || buffer_.find('\n') != std::string::npos) return true;
    if (timeout_ms_ >= 0 &&
        std::chrono::steady_clock::now() - last_line_ > std::chrono::milliseconds(timeout_ms_)) {
        why_ = strformat("no answer for %.1f s", timeout_ms_ / 1000.0);
        expired_ = true;
        return true;
    }
    pollfd pfd{in_, POLLIN, 0};
    const int rc = ::poll(&pfd, 1, ms);
    // Input, the end of it, or an error: read_line tells which.
    return rc != 0 && !(rc < 0 && errno == EINTR);
}

bool FdChannel::read_line(std::string* line) {
    if (expired_) return false;
    const auto deadline = line_deadline();
    while (true) {
        const size_t nl = buffer_.find('\n');
        if (nl != std::string::npos) {
            *line = buffer_.substr(0, nl);
            buffer_.erase(0, nl + 1);
            last_line_ = std::chrono::steady_clock::now();
            return true;
        }
        if (buffer_.size() > kMaxLineBytes) {
            why_ = strformat("a line longer than %zu bytes", kMaxLineBytes);
            return false;
        }
        if (!wait_for(in_, POLLIN, deadline)) return false;
        char buf[4096];
        const ssize_t n = ::read(in_, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        buffer_.append(buf, static_cast<size_t>(n));
    }
}

std::vector<std::string> words(const std::string& line) {
    std::istringstream in(line);
    std::vector<std::string> out;
    for (std::string w; in >> w;) out.push_back(w);
    return out;
}

bool parse_uint(std::string_view word, uint64_t max, uint64_t* out) {
    uint64_t v = 0;
    const char* end = word.data() + word.size();
    if (word.empty() || word[0] < '0' || word[0] > '9') return false;  // no sign, no blank
    const auto [at, ec] = std::from_chars(word.data(), end, v);
    if (ec != std::errc() || at != end || v > max) return false;
    *out = v;
    return true;
}

bool parse_int(std::string_view word, int min, int max, int* out) {
    int v = 0;
    const char* end = word.data() + word.size();
    if (word.empty() || !((word[0] >= '0' && word[0] <= '9') || (word[0] == '-' && min < 0))) {
        return false;
    }
    const auto [at, ec] = std::from_chars(word.data(), end, v);
    if (ec != std::errc() || at != end || v < min || v > max) return false;
    *out = v;
    return true;
}

bool parse_seconds(std::string_view word, double* out) {
    double v = 0;
    const char* end = word.data() + word.size();
    if (word.empty() || word[0] < '0' || word[0] > '9') return false;
    const auto [at, ec] = std::from_chars(word.data(), end, v);
    if (ec != std::errc() || at != end || !std::isfinite(v) || v < 0) return false;
    *out = v;
    return true;
}

std::string hex_blob(const std::string& bytes) { return to_hex(bytes.data(), bytes.size()); }

bool unhex_blob(const std::string& hex, std::string* bytes) {
    std::vector<uint8_t> raw;
    if (!from_hex(hex, &raw)) return false;
    bytes->assign(raw.begin(), raw.end());
    return true;
}

// --- the responder's loop ----------------------------------------------------------------------

Status serve_commands(Channel* ch, const CommandFn& handle, const std::function<void()>& close,
                      const IdleWork* idle) {
    std::string line;
    while (true) {
        if (idle != nullptr) {
            const int ms = idle->every_ms();
            if (ms >= 0) {
                idle->run();
                if (!ch->wait_input(ms)) continue;
            }
        }
        if (!ch->read_line(&line)) break;
        const auto w = words(line);
        if (w.empty()) continue;
        if (w[0] == "quit") {
            close();
            ch->write_line("bye");
            return Status();
        }
        Status st;
        std::string reply = "ok";
        try {
            st = handle(w, line, &reply);
        } catch (const std::exception&) {  // std::stoull and friends on a malformed number
            st = invalid_argument("malformed command: " + line.substr(0, 200));
        }
        if (!st.ok()) reply = "error " + st.to_string();
        if (!ch->write_line(reply)) break;
    }
    close();
    const std::string why = ch->why();
    return unavailable("benchmark initiator went away" + (why.empty() ? "" : " (" + why + ")"));
}

void refuse_commands(Channel* ch, const Status& why) {
    std::string line;
    while (ch->read_line(&line)) {
        if (line == "quit") {
            ch->write_line("bye");
            return;
        }
        ch->write_line("error " + why.to_string());
    }
}

// --- peers -------------------------------------------------------------------------------------

StatusOr<std::string> Peer::call(const std::string& command) {
    TCPX_RETURN_IF_ERROR(send(command));
    return reply();
}

namespace {

Status peer_gone(const Channel* ch) {
    const std::string why = ch->why();
    return unavailable("benchmark peer went away" + (why.empty() ? "" : " (" + why + ")"));
}

}  // namespace

Status Peer::send(const std::string& command) {
    if (!channel()->write_line(command)) return peer_gone(channel());
    return Status();
}

StatusOr<std::string> Peer::reply() {
    std::string line;
    if (!channel()->read_line(&line)) return peer_gone(channel());
    if (line.rfind("error ", 0) == 0) return remote_error("peer: " + line.substr(6));
    return line;
}

ThreadPeer::ThreadPeer(std::function<void(Channel*)> serve)
    : mine_(&to_peer_, &from_peer_), theirs_(&from_peer_, &to_peer_) {
    thread_ = std::thread([this, serve = std::move(serve)] { serve(&theirs_); });
}

ThreadPeer::~ThreadPeer() {
    mine_.write_line("quit");
    thread_.join();
}

StatusOr<std::unique_ptr<ProcessPeer>> ProcessPeer::spawn(const std::vector<std::string>& args) {
    int to_child[2];
    int from_child[2];
    if (::pipe2(to_child, O_CLOEXEC) != 0) return errno_status(errno, "pipe");
    if (::pipe2(from_child, O_CLOEXEC) != 0) {
        const int err = errno;
        ::close(to_child[0]);
        ::close(to_child[1]);
        return errno_status(err, "pipe");
    }
    std::vector<std::string> all = {"/proc/self/exe"};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
    pid_t pid = -1;
    const int rc = ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(to_child[0]);
    ::close(from_child[1]);
    if (rc != 0) {
        ::close(to_child[1]);
        ::close(from_child[0]);
        return errno_status(rc, "spawning the benchmark's second process");
    }
    return std::unique_ptr<ProcessPeer>(new ProcessPeer(pid, from_child[0], to_child[1]));
}

namespace {

// Waits up to `ms` for the child to exit, then kills it.
void reap(pid_t pid, int ms) {
    int status = 0;
    for (int i = 0; i < ms / 10 && ::waitpid(pid, &status, WNOHANG) == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (::waitpid(pid, &status, WNOHANG) != 0) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
}

}  // namespace

ProcessPeer::~ProcessPeer() {
    (void)call("quit");
    ::close(out_);
    ::close(in_);
    reap(pid_, 2000);
}

StatusOr<std::unique_ptr<ForkPeer>> ForkPeer::fork(const std::function<int(int fd)>& serve) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        return errno_status(errno, "socketpair");
    }
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t child = ::fork();
    if (child < 0) {
        const int err = errno;
        ::close(sv[0]);
        ::close(sv[1]);
        return errno_status(err, "fork");
    }
    if (child == 0) {
        ::close(sv[0]);
        const int rc = serve(sv[1]);
        std::fflush(stderr);
        ::_exit(rc);
    }
    ::close(sv[1]);
    return std::unique_ptr<ForkPeer>(new ForkPeer(child, sv[0]));
}

ForkPeer::~ForkPeer() {
    (void)call("quit");
    reap(pid_, 5000);
    ::close(fd_);
}

StatusOr<std::unique_ptr<SocketPeer>> SocketPeer::connect(const SocketAddress& addr,
                                                          int connect_timeout_ms,
                                                          int reply_timeout_ms) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(connect_timeout_ms);
    Status last;
    while (true) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                              deadline - std::chrono::steady_clock::now())
                              .count();
        if (left <= 0) break;
        StatusOr<Fd> fd = connect_blocking(addr, static_cast<int>(std::max<int64_t>(left, 1)));
        if (fd.ok()) {
            TCPX_RETURN_IF_ERROR(set_nonblocking(fd->get(), false));
            TCPX_RETURN_IF_ERROR(set_nodelay(fd->get()));
            // A host that vanishes (no FIN, no RST) ends the run instead of hanging it.
            TCPX_RETURN_IF_ERROR(set_dead_peer_timeout(fd->get(), 30000));
            TCPX_ASSIGN_OR_RETURN(SocketAddress local, local_address(fd->get()));
            return std::unique_ptr<SocketPeer>(
                new SocketPeer(std::move(*fd), local, reply_timeout_ms));
        }
        last = fd.status();
        // Nothing listens there (yet): try again shortly; anything else is final.
        if (last.message().find("refused") == std::string_view::npos) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return unavailable(strformat("no benchmark target answers at %s within %.1f s: %s",
                                 addr.to_string().c_str(), connect_timeout_ms / 1000.0,
                                 last.ok() ? "timed out" : std::string(last.message()).c_str()));
}

SocketPeer::~SocketPeer() {
    channel_.set_timeout(2000);
    (void)call("quit");
}

StatusOr<SocketAddress> parse_host_port(const std::string& text, bool allow_port_0) {
    std::string host;
    std::string port;
    if (!text.empty() && text[0] == '[') {
        const size_t close = text.find(']');
        if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
            return invalid_argument("'" + text + "' is not [IPV6]:PORT");
        }
        host = text.substr(1, close - 1);
        port = text.substr(close + 2);
    } else {
        const size_t colon = text.rfind(':');
        if (colon == std::string::npos || text.find(':') != colon) {
            return invalid_argument("'" + text +
                                    "' is not HOST:PORT (an IPv6 address goes in brackets: "
                                    "[::1]:PORT)");
        }
        host = text.substr(0, colon);
        port = text.substr(colon + 1);
    }
    int p = -1;
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    if (host.empty() || port.empty() || ec != std::errc() || end != port.data() + port.size() ||
        p < 0 || p > 65535 || (p == 0 && !allow_port_0)) {
        return invalid_argument("'" + text + "' is not HOST:PORT with a port in 1..65535");
    }
    StatusOr<SocketAddress> numeric = SocketAddress::parse(host, static_cast<uint16_t>(p));
    if (numeric.ok()) return numeric;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
    if (rc != 0 || res == nullptr) {
        return invalid_argument("'" + text + "': cannot resolve '" + host +
                                "': " + ::gai_strerror(rc));
    }
    StatusOr<SocketAddress> addr = SocketAddress::from_sockaddr(res->ai_addr, res->ai_addrlen);
    ::freeaddrinfo(res);
    if (!addr.ok()) return addr;
    addr->set_port(static_cast<uint16_t>(p));
    return addr;
}

StatusOr<std::string> interface_of(const SocketAddress& addr) {
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) return errno_status(errno, "getifaddrs");
    std::string name;
    for (ifaddrs* i = list; i != nullptr && name.empty(); i = i->ifa_next) {
        if (i->ifa_addr == nullptr) continue;
        const int family = i->ifa_addr->sa_family;
        if (family != AF_INET && family != AF_INET6) continue;
        const socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
        StatusOr<SocketAddress> a = SocketAddress::from_sockaddr(i->ifa_addr, len);
        if (a.ok() && a->same_host(addr)) name = i->ifa_name;
    }
    ::freeifaddrs(list);
    if (name.empty()) return not_found("no interface of this host has " + addr.host_string());
    return name;
}

// --- two hosts: the side channel ----------------------------------------------------------------

Status check_initiator_only(const std::vector<std::string>& initiator_only,
                            const std::function<bool(const std::string&)>& given) {
    for (const std::string& name : initiator_only) {
        if (given(name)) {
            return invalid_argument("--listen: " + name +
                                    " is the initiator's to choose (give it to --connect)");
        }
    }
    return Status();
}

StatusOr<std::string> side_channel_interface(const SocketAddress& local, const std::string& flag) {
    StatusOr<std::string> name = interface_of(local);
    if (!name.ok()) return Status(name.status()).with_context(flag + " without --interface");
    return "=" + *name;
}

Status target_interface(const SideChannel& side, std::string* interface) {
    if (!interface->empty()) return Status();
    StatusOr<SocketAddress> local = local_address(side.fd.get());
    StatusOr<std::string> name = local.ok() ? side_channel_interface(*local, "--listen")
                                            : StatusOr<std::string>(local.status());
    if (!name.ok()) {
        side.channel->write_line("error " + name.status().to_string());
        return name.status();
    }
    *interface = *name;
    return Status();
}

int reply_timeout_ms(double min_seconds) {
    return static_cast<int>(std::min(3600.0, 10 * min_seconds + 180) * 1000);
}

StatusOr<std::unique_ptr<SocketPeer>> connect_to_target(const std::string& addr,
                                                        double connect_timeout_s,
                                                        int reply_timeout_ms) {
    StatusOr<SocketAddress> parsed = parse_host_port(addr, false);
    if (!parsed.ok()) return Status(parsed.status()).with_context("--connect");
    return SocketPeer::connect(*parsed, static_cast<int>(connect_timeout_s * 1000),
                               reply_timeout_ms);
}

std::string greeting_line(const std::string& hello,
                          const std::vector<std::pair<std::string, std::string>>& settings) {
    std::string line = hello;
    for (const auto& [key, value] : settings) {
        if (!value.empty()) line += " " + key + "=" + value;
    }
    return line;
}

StatusOr<std::vector<std::pair<std::string, std::string>>> greeting_settings(
    const std::string& line, const std::string& hello, const std::string& program) {
    if (line.rfind(hello, 0) != 0 || (line.size() > hello.size() && line[hello.size()] != ' ')) {
        return invalid_argument("not a " + program + " initiator of this version (expected \"" +
                                hello + "\")");
    }
    std::vector<std::pair<std::string, std::string>> out;
    for (const std::string& w : words(line.substr(hello.size()))) {
        const size_t eq = w.find('=');
        if (eq == std::string::npos) return invalid_argument("hello: '" + w + "' is not key=value");
        out.emplace_back(w.substr(0, eq), w.substr(eq + 1));
    }
    return out;
}

StatusOr<std::string> greet_target(Peer* peer, const std::string& hello,
                                   const std::string& hello_line, const std::string& program,
                                   const std::string& addr) {
    TCPX_ASSIGN_OR_RETURN(std::string reply, peer->call(hello_line));
    if (reply.rfind(hello, 0) != 0) {
        return protocol_error("--connect " + addr + ": not a " + program +
                              " target of this version: " + reply.substr(0, 200));
    }
    return std::string(trim(std::string_view(reply).substr(hello.size())));
}

StatusOr<Fd> listen_side_channel(const std::string& program, const std::string& listen) {
    StatusOr<SocketAddress> addr = parse_host_port(listen, true);
    if (!addr.ok()) return Status(addr.status()).with_context("--listen");
    StatusOr<Fd> listening = listen_tcp(*addr, 16);
    if (!listening.ok()) return Status(listening.status()).with_context("--listen " + listen);
    Fd listener = std::move(*listening);
    TCPX_RETURN_IF_ERROR(set_nonblocking(listener.get(), false));
    TCPX_ASSIGN_OR_RETURN(SocketAddress bound, local_address(listener.get()));
    std::printf("%s: target listening on %s (side channel: plaintext, unauthenticated)\n",
                program.c_str(), bound.to_string().c_str());
    std::fflush(stdout);
    return listener;
}

StatusOr<SideChannel> accept_initiator(const std::string& program, const Fd& listener,
                                       const std::function<Status(const std::string&)>& check_hello,
                                       int greeting_ms) {
    TCPX_ASSIGN_OR_RETURN(SocketAddress bound, local_address(listener.get()));
    while (true) {
        Fd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (!conn.valid()) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return errno_status(errno, "accept on " + bound.to_string());
        }
        StatusOr<SocketAddress> from = peer_address(conn.get());
        const std::string who = from.ok() ? from->to_string() : std::string("?");
        // The greeting must come whole and soon (one connection is served at a time); later
        // commands may wait as long as a measurement runs.
        auto ch = std::make_unique<FdChannel>(conn.get(), conn.get(), greeting_ms);
        std::string line;
        if (!ch->read_line(&line)) {
            std::fprintf(stderr, "%s: %s: no greeting%s; still listening\n", program.c_str(),
                         who.c_str(), ch->why().empty() ? "" : (" (" + ch->why() + ")").c_str());
            continue;
        }
        Status st = check_hello(line);
        if (!st.ok()) {
            ch->write_line("error " + st.to_string());
            std::fprintf(stderr, "%s: %s refused: %s; still listening\n", program.c_str(),
                         who.c_str(), printable(st.to_string()).c_str());
            continue;
        }
        (void)set_nodelay(conn.get());
        (void)set_dead_peer_timeout(conn.get(), 30000);
        return SideChannel{std::move(conn), std::move(ch), who, line};
    }
}

}  // namespace tcpx::bench
