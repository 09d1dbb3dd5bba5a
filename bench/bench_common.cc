#include "bench/bench_common.h"

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
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>

#include "common/params.h"
#include "common/status_util.h"
#include "common/strings.h"

extern char** environ;

namespace tcpx::bench {

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

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

bool QueueChannel::write_line(const std::string& line) {
    out_->push(line);
    return true;
}

bool QueueChannel::read_line(std::string* line) {
    *line = in_->pop();
    return true;
}

bool FdChannel::wait_for(int fd, short events) {
    if (timeout_ms_ < 0) return true;
    pollfd pfd{fd, events, 0};
    while (true) {
        const int rc = ::poll(&pfd, 1, timeout_ms_);
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) {
            why_ = std::string("poll: ") + std::strerror(errno);
            return false;
        }
        if (rc == 0) {
            why_ = strformat("no answer for %.1f s", timeout_ms_ / 1000.0);
            return false;
        }
        return true;
    }
}

bool FdChannel::write_line(const std::string& line) {
    const std::string data = line + "\n";
    size_t off = 0;
    while (off < data.size()) {
        if (!wait_for(out_, POLLOUT)) return false;
        const ssize_t n = ::write(out_, data.data() + off, data.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        off += static_cast<size_t>(n);
    }
    return true;
}

bool FdChannel::read_line(std::string* line) {
    while (true) {
        const size_t nl = buffer_.find('\n');
        if (nl != std::string::npos) {
            *line = buffer_.substr(0, nl);
            buffer_.erase(0, nl + 1);
            return true;
        }
        if (buffer_.size() > kMaxLineBytes) {
            why_ = strformat("a line longer than %zu bytes", kMaxLineBytes);
            return false;
        }
        if (!wait_for(in_, POLLIN)) return false;
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

std::string hex_blob(const std::string& bytes) { return to_hex(bytes.data(), bytes.size()); }

bool unhex_blob(const std::string& hex, std::string* bytes) {
    std::vector<uint8_t> raw;
    if (!from_hex(hex, &raw)) return false;
    bytes->assign(raw.begin(), raw.end());
    return true;
}

// --- command-line sizes ------------------------------------------------------------------------

bool parse_size_list(const std::string& text, std::vector<uint64_t>* out) {
    out->clear();
    for (const std::string& item : split_trimmed(text, ',')) {
        const size_t dots = item.find("..");
        if (dots != std::string::npos) {
            uint64_t lo = 0;
            uint64_t hi = 0;
            if (!parse_size(item.substr(0, dots), &lo) || !parse_size(item.substr(dots + 2), &hi) ||
                lo == 0 || lo > hi) {
                return false;
            }
            for (uint64_t s = lo; s <= hi; s *= 4) out->push_back(s);
            continue;
        }
        uint64_t v = 0;
        if (!parse_size(item, &v)) return false;
        out->push_back(v);
    }
    return !out->empty();
}

bool parse_gpu_pair(const std::string& text, std::vector<int>* out) {
    out->clear();
    const size_t comma = text.find(',');
    if (comma == std::string::npos) return false;
    const std::string_view all(text);
    for (std::string_view item : {all.substr(0, comma), all.substr(comma + 1)}) {
        item = trim(item);
        int v = -1;
        const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
        if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 0 ||
            v > 1023) {
            return false;
        }
        out->push_back(v);
    }
    return true;
}

// --- patterns for --verify ---------------------------------------------------------------------

namespace {

uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

uint8_t pattern_byte(uint64_t seed, uint64_t i) {
    const uint64_t word = mix64(seed ^ (i / 8));
    return static_cast<uint8_t>(word >> (8 * (i % 8)));
}

}  // namespace

uint64_t pattern_seed(uint64_t run, int peer) {
    return mix64(run * 0x100000001b3ULL + static_cast<uint64_t>(peer));
}

void fill_pattern(uint8_t* p, uint64_t len, uint64_t seed) {
    uint64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        const uint64_t word = mix64(seed ^ (i / 8));
        std::memcpy(p + i, &word, 8);
    }
    for (; i < len; ++i) p[i] = pattern_byte(seed, i);
}

// OK, or which byte differs (kInternal, "<what>: byte ...").
Status check_pattern(const uint8_t* p, uint64_t len, uint64_t seed, const std::string& what) {
    uint64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        const uint64_t word = mix64(seed ^ (i / 8));
        if (std::memcmp(p + i, &word, 8) != 0) break;
    }
    for (; i < len; ++i) {
        const uint8_t want = pattern_byte(seed, i);
        if (p[i] != want) {
            return internal_error(strformat("%s: byte %llu of %llu is 0x%02x, expected 0x%02x%s",
                                            what.c_str(), static_cast<unsigned long long>(i),
                                            static_cast<unsigned long long>(len), p[i], want,
                                            p[i] == kPoison ? " (never written)" : ""));
        }
    }
    return Status();
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

ProcessPeer::~ProcessPeer() {
    (void)call("quit");
    ::close(out_);
    ::close(in_);
    int status = 0;
    for (int i = 0; i < 200 && ::waitpid(pid_, &status, WNOHANG) == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
}

StatusOr<std::unique_ptr<SocketPeer>> SocketPeer::connect(const SocketAddress& addr,
                                                          int connect_timeout_ms,
                                                          int reply_timeout_ms) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(connect_timeout_ms);
    Status last;
    while (true) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
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

// --- threads and stream splitting --------------------------------------------------------------

uint64_t stream_share(uint64_t size, int n, int i) {
    const uint64_t base = size / static_cast<uint64_t>(n);
    return base + (static_cast<uint64_t>(i) < size % static_cast<uint64_t>(n) ? 1 : 0);
}

uint64_t stream_offset(uint64_t size, int n, int i) {
    const uint64_t base = size / static_cast<uint64_t>(n);
    const uint64_t rem = size % static_cast<uint64_t>(n);
    return base * static_cast<uint64_t>(i) + std::min<uint64_t>(static_cast<uint64_t>(i), rem);
}

Status run_threads(int n, const std::function<Status(int)>& fn) {
    std::vector<std::thread> threads;
    std::mutex mu;
    Status first;
    for (int i = 0; i < n; ++i) {
        threads.emplace_back([&, i] {
            Status st = fn(i);
            std::lock_guard<std::mutex> lock(mu);
            if (first.ok() && !st.ok()) first = st;
        });
    }
    for (auto& t : threads) t.join();
    return first;
}

namespace {

// Every stream moves its share of `count` messages of `size` bytes; message k at slot k % slots
// of `buf`.
Status move_streams(const std::vector<Fd>& conns, int n, bool send, uint64_t size, uint64_t count,
                    uint8_t* buf, uint64_t slots) {
    return run_threads(n, [&](int i) -> Status {
        const uint64_t share = stream_share(size, n, i);
        const uint64_t offset = stream_offset(size, n, i);
        const int fd = conns[static_cast<size_t>(i)].get();
        for (uint64_t k = 0; k < count; ++k) {
            uint8_t* p = buf + (k % slots) * size + offset;
            TCPX_RETURN_IF_ERROR(send ? send_all(fd, p, share) : recv_all(fd, p, share));
        }
        return Status();
    });
}

}  // namespace

// --- the raw TCP baseline: responder -----------------------------------------------------------

bool RawTcpResponder::handle(const std::vector<std::string>& w, const BufferFn& buffer, Status* st,
                             std::string* reply) {
    if (w.empty()) return false;
    if (w[0] == "raw-listen") {
        *st = listen(reply);
    } else if (w[0] == "raw-accept" && w.size() == 2) {
        *st = accept(std::stoi(w[1]));
    } else if (w[0] == "raw-stream" && (w.size() == 4 || (w.size() == 5 && w[4] == "send"))) {
        *st =
            stream(std::stoull(w[1]), std::stoull(w[2]), std::stoull(w[3]), w.size() == 5, buffer);
    } else if (w[0] == "raw-pingpong" && (w.size() == 3 || w.size() == 4)) {
        const uint64_t size = std::stoull(w[1]);
        *st = pingpong(size, std::stoull(w[2]), w.size() == 4 ? std::stoull(w[3]) : size, buffer);
    } else {
        return false;
    }
    return true;
}

Status RawTcpResponder::listen(std::string* reply) {
    TCPX_ASSIGN_OR_RETURN(auto ifs, find_interfaces(interface_, AddressFamily::kAny));
    TCPX_ASSIGN_OR_RETURN(listen_, listen_tcp(ifs[0].address, 128));
    TCPX_RETURN_IF_ERROR(set_nonblocking(listen_.get(), false));
    TCPX_ASSIGN_OR_RETURN(SocketAddress addr, local_address(listen_.get()));
    *reply = "port " + std::to_string(addr.port()) + " " + addr.host_string();
    return Status();
}

// `streams` stream connections then one ping-pong connection, each announcing its index.
Status RawTcpResponder::accept(int streams) {
    if (!listen_.valid()) return failed_precondition("raw-accept before raw-listen");
    if (streams < 1) return invalid_argument("raw-accept: no streams");
    conns_.clear();
    conns_.resize(static_cast<size_t>(streams) + 1);
    for (int i = 0; i <= streams; ++i) {
        Fd fd(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (!fd.valid()) return errno_status(errno, "accept");
        uint32_t index = 0;
        TCPX_RETURN_IF_ERROR(recv_all(fd.get(), &index, sizeof(index)));
        if (index >= conns_.size() || conns_[index].valid()) {
            return protocol_error("bad raw stream index");
        }
        TCPX_RETURN_IF_ERROR(set_nodelay(fd.get()));
        conns_[index] = std::move(fd);
    }
    return Status();
}

Status RawTcpResponder::stream(uint64_t size, uint64_t count, uint64_t slots, bool send,
                               const BufferFn& buffer) {
    if (conns_.size() < 2) return failed_precondition("raw-stream before raw-accept");
    if (slots == 0) return invalid_argument("raw-stream: no slots");
    TCPX_ASSIGN_OR_RETURN(uint8_t * buf, buffer(size * slots));
    return move_streams(conns_, static_cast<int>(conns_.size()) - 1, send, size, count, buf, slots);
}

Status RawTcpResponder::pingpong(uint64_t size, uint64_t count, uint64_t reply,
                                 const BufferFn& buffer) {
    if (conns_.size() < 2) return failed_precondition("raw-pingpong before raw-accept");
    TCPX_ASSIGN_OR_RETURN(uint8_t * buf, buffer(std::max(size, reply)));
    const int fd = conns_.back().get();
    for (uint64_t i = 0; i < count; ++i) {
        TCPX_RETURN_IF_ERROR(recv_all(fd, buf, size));
        TCPX_RETURN_IF_ERROR(send_all(fd, buf, reply));
    }
    return Status();
}

void RawTcpResponder::close() {
    conns_.clear();
    listen_.reset();
}

// --- the raw TCP baseline: initiator -----------------------------------------------------------

Status RawTcpInitiator::connect(Peer* peer, int streams) {
    conns_.clear();
    TCPX_ASSIGN_OR_RETURN(std::string reply, peer->call("raw-listen"));
    const auto w = words(reply);
    if (w.size() != 3 || w[0] != "port") return protocol_error("peer: " + reply);
    TCPX_ASSIGN_OR_RETURN(SocketAddress addr,
                          SocketAddress::parse(w[2], static_cast<uint16_t>(std::stoi(w[1]))));
    TCPX_RETURN_IF_ERROR(peer->send("raw-accept " + std::to_string(streams)));
    for (int i = 0; i <= streams; ++i) {
        TCPX_ASSIGN_OR_RETURN(Fd fd, connect_blocking(addr, 10000));
        TCPX_RETURN_IF_ERROR(set_nodelay(fd.get()));
        const uint32_t index = static_cast<uint32_t>(i);
        TCPX_RETURN_IF_ERROR(send_all(fd.get(), &index, sizeof(index)));
        conns_.push_back(std::move(fd));
    }
    return peer->reply().status();
}

StatusOr<double> RawTcpInitiator::stream(Peer* peer, bool to_peer, uint64_t size, uint64_t count,
                                         uint8_t* buf, uint64_t slots, uint64_t peer_slots) {
    if (conns_.size() < 2) return failed_precondition("raw TCP baseline not connected");
    const int n = streams();
    const std::string command = "raw-stream " + std::to_string(size) + " " + std::to_string(count) +
                                " " + std::to_string(peer_slots);
    if (to_peer) {
        TCPX_RETURN_IF_ERROR(peer->send(command));
        const auto start = Clock::now();
        TCPX_RETURN_IF_ERROR(move_streams(conns_, n, true, size, count, buf, slots));
        TCPX_RETURN_IF_ERROR(peer->reply().status());
        return seconds_since(start);
    }
    const auto start = Clock::now();
    TCPX_RETURN_IF_ERROR(peer->send(command + " send"));
    TCPX_RETURN_IF_ERROR(move_streams(conns_, n, false, size, count, buf, slots));
    const double seconds = seconds_since(start);
    TCPX_RETURN_IF_ERROR(peer->reply().status());
    return seconds;
}

StatusOr<std::vector<double>> RawTcpInitiator::pingpong(Peer* peer, uint64_t out, uint64_t back,
                                                        uint64_t count, uint8_t* buf) {
    if (conns_.size() < 2) return failed_precondition("raw TCP baseline not connected");
    std::string command = "raw-pingpong " + std::to_string(out) + " " + std::to_string(count);
    if (back != out) command += " " + std::to_string(back);
    TCPX_RETURN_IF_ERROR(peer->send(command));
    const int fd = conns_.back().get();
    std::vector<double> rtts;
    rtts.reserve(count);
    for (uint64_t i = 0; i < count; ++i) {
        const auto start = Clock::now();
        TCPX_RETURN_IF_ERROR(send_all(fd, buf, out));
        TCPX_RETURN_IF_ERROR(recv_all(fd, buf, back));
        rtts.push_back(seconds_since(start) * 1e6);
    }
    TCPX_RETURN_IF_ERROR(peer->reply().status());
    return rtts;
}

// --- measurements ------------------------------------------------------------------------------

Latency summarize(std::vector<double> samples_us) {
    Latency out;
    if (samples_us.empty()) return out;
    std::sort(samples_us.begin(), samples_us.end());
    const size_t n = samples_us.size();
    out.p50_us = samples_us[n / 2];
    out.p99_us = samples_us[std::min(n - 1, n * 99 / 100)];
    double sum = 0;
    for (double v : samples_us) sum += v;
    out.mean_us = sum / static_cast<double>(n);
    out.iters = n;
    return out;
}

double process_cpu_seconds() {
    timespec ts{};
    if (::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0;
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

StatusOr<double> peer_cpu_seconds(Peer* peer) {
    TCPX_ASSIGN_OR_RETURN(std::string reply, peer->call("cpu"));
    const auto w = words(reply);
    double seconds = -1;
    if (w.size() == 2 && w[0] == "cpu") {
        const char* end = w[1].c_str();
        char* parsed = nullptr;
        seconds = std::strtod(end, &parsed);
        if (parsed == end || *parsed != '\0') seconds = -1;
    }
    if (seconds < 0) return protocol_error("peer: expected \"cpu <seconds>\", got: " + reply);
    return seconds;
}

double cpu_per_gb(const Throughput& t) {
    const double gb = t.gbps * t.seconds;  // GB moved in the measured run
    return t.cpu_seconds > 0 && gb > 0 ? t.cpu_seconds / gb : 0;
}

std::string cpu_cell(const Throughput& t) {
    const double v = cpu_per_gb(t);
    return v > 0 ? strformat("%.3f", v) : std::string("-");
}

StatusOr<Throughput> measure_throughput(const Calibration& cal, uint64_t bytes_per_iter,
                                        const std::function<StatusOr<double>(uint64_t)>& timed,
                                        const CpuClock& cpu) {
    // Every run between two readings of both sides' CPU clocks: the last run's is the figure.
    CpuTimes used;
    auto run = [&](uint64_t count) -> StatusOr<double> {
        CpuTimes before;
        if (cpu) {
            TCPX_ASSIGN_OR_RETURN(before, cpu());
        }
        TCPX_ASSIGN_OR_RETURN(double seconds, timed(count));
        if (cpu) {
            TCPX_ASSIGN_OR_RETURN(CpuTimes after, cpu());
            used = CpuTimes{after.here - before.here, after.peer - before.peer};
        }
        return seconds;
    };
    constexpr uint64_t kMaxCount = 5'000'000;
    uint64_t count =
        std::clamp<uint64_t>((32ULL << 20) / std::max<uint64_t>(bytes_per_iter, 1), 4, 2000);
    TCPX_ASSIGN_OR_RETURN(double t, run(count));
    while (t < cal.min_seconds / 8 && count < kMaxCount) {
        count = std::min(kMaxCount, count * 4);
        TCPX_ASSIGN_OR_RETURN(t, run(count));
    }
    auto count_for = [&](double seconds, uint64_t iters) {
        const double per = std::max(seconds / static_cast<double>(iters), 1e-9);
        return std::clamp<uint64_t>(static_cast<uint64_t>(cal.min_seconds / per), cal.min_iters,
                                    std::max(kMaxCount, cal.min_iters));
    };
    count = count_for(t, count);
    TCPX_ASSIGN_OR_RETURN(double seconds, run(count));
    for (int retry = 0; retry < 2 && seconds < cal.min_seconds / 2; ++retry) {
        const uint64_t more = count_for(seconds, count);
        if (more <= count) break;  // at the iteration cap already
        count = more;
        TCPX_ASSIGN_OR_RETURN(seconds, run(count));
    }
    Throughput out;
    out.iters = count;
    out.seconds = seconds;
    out.gbps = static_cast<double>(bytes_per_iter) * static_cast<double>(count) / seconds / 1e9;
    out.cpu_seconds = used.here + used.peer;
    out.peer_cpu_seconds = used.peer;
    return out;
}

StatusOr<Latency> measure_latency(
    const Calibration& cal, const std::function<StatusOr<std::vector<double>>(uint64_t)>& run) {
    constexpr uint64_t kMaxSamples = 200000;
    TCPX_ASSIGN_OR_RETURN(auto warm, run(20));
    double sum = 0;
    for (double v : warm) sum += v;
    const double per = std::max(sum / 20.0 / 1e6, 1e-7);
    const uint64_t count =
        std::clamp<uint64_t>(static_cast<uint64_t>(cal.min_seconds / per), cal.min_iters,
                             std::max<uint64_t>(kMaxSamples, cal.min_iters));
    TCPX_ASSIGN_OR_RETURN(auto samples, run(count));
    for (int retry = 0; retry < 2 && samples.size() < kMaxSamples; ++retry) {
        double total_us = 0;
        for (double v : samples) total_us += v;
        if (total_us / 1e6 >= cal.min_seconds / 2) break;
        const double mean_s = std::max(total_us / static_cast<double>(samples.size()) / 1e6, 1e-7);
        const uint64_t more = std::min<uint64_t>(
            static_cast<uint64_t>((cal.min_seconds - total_us / 1e6) / mean_s) + 1,
            kMaxSamples - samples.size());
        TCPX_ASSIGN_OR_RETURN(auto extra, run(more));
        samples.insert(samples.end(), extra.begin(), extra.end());
    }
    return summarize(std::move(samples));
}

// --- reporting ---------------------------------------------------------------------------------

Progress::Progress(bool enabled) : enabled_(enabled && ::isatty(STDERR_FILENO)) {}

void Progress::show(size_t step, size_t steps, const std::string& what) {
    if (!enabled_) return;
    std::fprintf(stderr, "\r\033[K[%zu/%zu] %s", step, steps, what.c_str());
    std::fflush(stderr);
}

void Progress::clear() {
    if (enabled_) std::fprintf(stderr, "\r\033[K");
}

std::string ratio(double a, double b) {
    if (b <= 0 || a <= 0) return "-";
    return strformat("%.2fx", a / b);
}

}  // namespace tcpx::bench
