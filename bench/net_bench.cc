#include "bench/net_bench.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "common/socket.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "net/socket/socket_net.h"

extern char** environ;

namespace tcpx::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

// --- a line-oriented command channel between initiator and responder
// ------------------------------

class Channel {
 public:
    virtual ~Channel() = default;
    virtual bool write_line(const std::string& line) = 0;
    virtual bool read_line(std::string* line) = 0;
};

// One direction of an in-process channel.
class LineQueue {
 public:
    void push(std::string line) {
        std::lock_guard<std::mutex> lock(mu_);
        lines_.push_back(std::move(line));
        cv_.notify_one();
    }
    std::string pop() {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !lines_.empty(); });
        std::string line = std::move(lines_.front());
        lines_.pop_front();
        return line;
    }

 private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::string> lines_;
};

class QueueChannel final : public Channel {
 public:
    QueueChannel(LineQueue* out, LineQueue* in) : out_(out), in_(in) {}
    bool write_line(const std::string& line) override {
        out_->push(line);
        return true;
    }
    bool read_line(std::string* line) override {
        *line = in_->pop();
        return true;
    }

 private:
    LineQueue* out_;
    LineQueue* in_;
};

class FdChannel final : public Channel {
 public:
    FdChannel(int in, int out) : in_(in), out_(out) {}
    bool write_line(const std::string& line) override {
        const std::string data = line + "\n";
        size_t off = 0;
        while (off < data.size()) {
            const ssize_t n = ::write(out_, data.data() + off, data.size() - off);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return false;
            off += static_cast<size_t>(n);
        }
        return true;
    }
    bool read_line(std::string* line) override {
        while (true) {
            const size_t nl = buffer_.find('\n');
            if (nl != std::string::npos) {
                *line = buffer_.substr(0, nl);
                buffer_.erase(0, nl + 1);
                return true;
            }
            char buf[4096];
            const ssize_t n = ::read(in_, buf, sizeof(buf));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return false;
            buffer_.append(buf, static_cast<size_t>(n));
        }
    }

 private:
    int in_;
    int out_;
    std::string buffer_;
};

std::vector<std::string> words(const std::string& line) {
    std::istringstream in(line);
    std::vector<std::string> out;
    for (std::string w; in >> w;) out.push_back(w);
    return out;
}

// --- net helpers
// -----------------------------------------------------------------------------------

// Polls: spins first (a completion is usually microseconds away), then yields the core so the
// I/O threads can run on a machine with few cores.
Status wait_req(net::Net* net, net::Request* req) {
    for (int spins = 0;; ++spins) {
        bool done = false;
        TCPX_RETURN_IF_ERROR(net->test(req, &done, nullptr));
        if (done) return Status();
        if (spins > 200) std::this_thread::yield();
    }
}

Status post_send(net::Net* net, net::SendComm* comm, const void* data, size_t size,
                 net::Request** req) {
    *req = nullptr;
    while (*req == nullptr) TCPX_RETURN_IF_ERROR(net->isend(comm, data, size, 0, nullptr, req));
    return Status();
}

Status post_recv(net::Net* net, net::RecvComm* comm, void* data, size_t size, net::Request** req) {
    *req = nullptr;
    int tag = 0;
    while (*req == nullptr) {
        TCPX_RETURN_IF_ERROR(net->irecv(comm, 1, &data, &size, &tag, nullptr, req));
    }
    return Status();
}

Status finish_recv(net::Net* net, net::RecvComm* comm, net::Request* req) {
    TCPX_RETURN_IF_ERROR(wait_req(net, req));
    return net->irecv_consumed(comm, 1, req);
}

Status connect_both(net::Net* net, net::Handle* handle, net::SendComm** send,
                    net::ListenComm* listen, net::RecvComm** recv) {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (*send == nullptr || *recv == nullptr) {
        if (*send == nullptr) TCPX_RETURN_IF_ERROR(net->connect(0, handle, send, nullptr));
        if (*recv == nullptr) TCPX_RETURN_IF_ERROR(net->accept(listen, recv, nullptr));
        if (Clock::now() > deadline) return timeout_error("connecting the benchmark's comms");
    }
    return Status();
}

StatusOr<net::Handle> parse_handle(const std::string& hex) {
    std::vector<uint8_t> raw;
    net::Handle handle;
    if (!from_hex(hex, &raw) || raw.size() != handle.bytes.size()) {
        return invalid_argument("bad handle from peer");
    }
    std::memcpy(handle.bytes.data(), raw.data(), raw.size());
    return handle;
}

// Splits `size` bytes over `n` streams: stream i carries share(i) bytes at offset(i).
uint64_t stream_share(uint64_t size, int n, int i) {
    const uint64_t base = size / static_cast<uint64_t>(n);
    return base + (static_cast<uint64_t>(i) < size % static_cast<uint64_t>(n) ? 1 : 0);
}
uint64_t stream_offset(uint64_t size, int n, int i) {
    const uint64_t base = size / static_cast<uint64_t>(n);
    const uint64_t rem = size % static_cast<uint64_t>(n);
    return base * static_cast<uint64_t>(i) + std::min<uint64_t>(static_cast<uint64_t>(i), rem);
}

// Receive buffers in flight are capped at this many bytes (a window of 16 64 MiB messages
// would be 1 GiB).
constexpr uint64_t kMaxInFlightBytes = 512ULL << 20;

// Runs fn(i) on n threads at once and joins them; the first error wins.
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

// --- the responder
// ---------------------------------------------------------------------------------

// Serves the initiator's commands: the receiving end of every measurement.
class Responder {
 public:
    Responder(net::Net* net, const NetBenchOptions& options) : net_(net), options_(options) {}
    ~Responder() { close(); }

    // Runs until "quit" or a broken channel.
    Status serve(Channel* ch) {
        std::string line;
        while (ch->read_line(&line)) {
            const auto w = words(line);
            if (w.empty()) continue;
            Status st;
            std::string reply = "ok";
            if (w[0] == "quit") {
                close();
                ch->write_line("bye");
                return Status();
            } else if (w[0] == "listen") {
                st = listen(&reply);
            } else if (w[0] == "connect" && w.size() == 2) {
                st = connect(w[1]);
            } else if (w[0] == "stream" && w.size() == 4) {
                st = stream(std::stoull(w[1]), std::stoull(w[2]), std::stoi(w[3]));
            } else if (w[0] == "pingpong" && w.size() == 3) {
                st = pingpong(ch, std::stoull(w[1]), std::stoull(w[2]));
            } else if (w[0] == "raw-listen") {
                st = raw_listen(&reply);
            } else if (w[0] == "raw-accept") {
                st = raw_accept();
            } else if (w[0] == "raw-stream" && w.size() == 4) {
                st = raw_stream(std::stoull(w[1]), std::stoull(w[2]), std::stoi(w[3]));
            } else if (w[0] == "raw-pingpong" && w.size() == 3) {
                st = raw_pingpong(std::stoull(w[1]), std::stoull(w[2]));
            } else {
                st = invalid_argument("unknown command: " + line);
            }
            if (!st.ok()) reply = "error " + st.to_string();
            if (!ch->write_line(reply)) break;
        }
        return unavailable("benchmark initiator went away");
    }

 private:
    Status listen(std::string* reply) {
        net::Handle handle;
        TCPX_RETURN_IF_ERROR(net_->listen(0, &handle, &listen_));
        *reply = "handle " + to_hex(handle.bytes.data(), handle.bytes.size());
        return Status();
    }

    Status connect(const std::string& hex) {
        TCPX_ASSIGN_OR_RETURN(net::Handle handle, parse_handle(hex));
        return connect_both(net_, &handle, &send_, listen_, &recv_);
    }

    Status ensure_buffer(size_t bytes) {
        if (buffer_.size() < bytes) buffer_.assign(bytes, 0);
        return Status();
    }

    Status stream(uint64_t size, uint64_t count, int window) {
        TCPX_RETURN_IF_ERROR(ensure_buffer(size * static_cast<uint64_t>(window)));
        std::deque<net::Request*> inflight;
        for (uint64_t i = 0; i < count; ++i) {
            if (inflight.size() >= static_cast<size_t>(window)) {
                TCPX_RETURN_IF_ERROR(finish_recv(net_, recv_, inflight.front()));
                inflight.pop_front();
            }
            net::Request* req = nullptr;
            void* dst = buffer_.data() + (i % static_cast<uint64_t>(window)) * size;
            TCPX_RETURN_IF_ERROR(post_recv(net_, recv_, dst, size, &req));
            inflight.push_back(req);
        }
        for (net::Request* req : inflight) TCPX_RETURN_IF_ERROR(finish_recv(net_, recv_, req));
        return Status();
    }

    Status pingpong(Channel* ch, uint64_t size, uint64_t count) {
        TCPX_RETURN_IF_ERROR(ensure_buffer(size));
        net::Request* rreq = nullptr;
        TCPX_RETURN_IF_ERROR(post_recv(net_, recv_, buffer_.data(), size, &rreq));
        ch->write_line("ready");
        for (uint64_t i = 0; i < count; ++i) {
            TCPX_RETURN_IF_ERROR(finish_recv(net_, recv_, rreq));
            net::Request* sreq = nullptr;
            TCPX_RETURN_IF_ERROR(post_send(net_, send_, buffer_.data(), size, &sreq));
            if (i + 1 < count) {
                TCPX_RETURN_IF_ERROR(post_recv(net_, recv_, buffer_.data(), size, &rreq));
            }
            TCPX_RETURN_IF_ERROR(wait_req(net_, sreq));
        }
        return Status();
    }

    Status raw_listen(std::string* reply) {
        TCPX_ASSIGN_OR_RETURN(auto ifs, find_interfaces(options_.interface, AddressFamily::kAny));
        TCPX_ASSIGN_OR_RETURN(raw_listen_, listen_tcp(ifs[0].address, 128));
        TCPX_RETURN_IF_ERROR(set_nonblocking(raw_listen_.get(), false));
        TCPX_ASSIGN_OR_RETURN(SocketAddress addr, local_address(raw_listen_.get()));
        *reply = "port " + std::to_string(addr.port()) + " " + addr.host_string();
        return Status();
    }

    // nsocks stream sockets then one ping-pong socket, each announcing its index.
    Status raw_accept() {
        raw_.clear();
        raw_.resize(static_cast<size_t>(options_.nsocks) + 1);
        for (int i = 0; i <= options_.nsocks; ++i) {
            Fd fd(::accept4(raw_listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
            if (!fd.valid()) return errno_status(errno, "accept");
            uint32_t index = 0;
            TCPX_RETURN_IF_ERROR(recv_all(fd.get(), &index, sizeof(index)));
            if (index >= raw_.size()) return protocol_error("bad raw stream index");
            TCPX_RETURN_IF_ERROR(set_nodelay(fd.get()));
            raw_[index] = std::move(fd);
        }
        return Status();
    }

    // Message k lands in buffer k % window, each stream's share at its offset: the same bytes
    // in the same places as the transport's receives.
    Status raw_stream(uint64_t size, uint64_t count, int window) {
        const int n = options_.nsocks;
        TCPX_RETURN_IF_ERROR(ensure_buffer(size * static_cast<uint64_t>(window)));
        return run_threads(n, [&](int i) -> Status {
            const uint64_t share = stream_share(size, n, i);
            const uint64_t offset = stream_offset(size, n, i);
            for (uint64_t k = 0; k < count; ++k) {
                uint8_t* dst = buffer_.data() + (k % static_cast<uint64_t>(window)) * size + offset;
                TCPX_RETURN_IF_ERROR(recv_all(raw_[static_cast<size_t>(i)].get(), dst, share));
            }
            return Status();
        });
    }

    Status raw_pingpong(uint64_t size, uint64_t count) {
        TCPX_RETURN_IF_ERROR(ensure_buffer(size));
        const int fd = raw_.back().get();
        for (uint64_t i = 0; i < count; ++i) {
            TCPX_RETURN_IF_ERROR(recv_all(fd, buffer_.data(), size));
            TCPX_RETURN_IF_ERROR(send_all(fd, buffer_.data(), size));
        }
        return Status();
    }

    void close() {
        if (send_ != nullptr) (void)net_->close_send(send_);
        if (recv_ != nullptr) (void)net_->close_recv(recv_);
        if (listen_ != nullptr) (void)net_->close_listen(listen_);
        send_ = nullptr;
        recv_ = nullptr;
        listen_ = nullptr;
        raw_.clear();
        raw_listen_.reset();
    }

    net::Net* net_;
    const NetBenchOptions& options_;
    net::ListenComm* listen_ = nullptr;
    net::SendComm* send_ = nullptr;  // responder -> initiator (ping-pong replies)
    net::RecvComm* recv_ = nullptr;  // initiator -> responder
    std::vector<uint8_t> buffer_;
    Fd raw_listen_;
    std::vector<Fd> raw_;
};

// --- the peer: the responder on a thread, or in a child process
// -----------------------------------

class Peer {
 public:
    virtual ~Peer() = default;
    virtual Channel* channel() = 0;

    // Sends a command and returns the reply; an "error ..." reply becomes a status.
    StatusOr<std::string> call(const std::string& command) {
        TCPX_RETURN_IF_ERROR(send(command));
        return reply();
    }
    Status send(const std::string& command) {
        if (!channel()->write_line(command)) return unavailable("benchmark peer went away");
        return Status();
    }
    StatusOr<std::string> reply() {
        std::string line;
        if (!channel()->read_line(&line)) return unavailable("benchmark peer went away");
        if (line.rfind("error ", 0) == 0) return remote_error("peer: " + line.substr(6));
        return line;
    }
};

class ThreadPeer final : public Peer {
 public:
    ThreadPeer(net::Net* net, const NetBenchOptions& options)
        : mine_(&to_peer_, &from_peer_), theirs_(&from_peer_, &to_peer_) {
        thread_ = std::thread([this, net, &options] {
            Responder responder(net, options);
            (void)responder.serve(&theirs_);
        });
    }
    ~ThreadPeer() override {
        mine_.write_line("quit");
        thread_.join();
    }
    Channel* channel() override { return &mine_; }

 private:
    LineQueue to_peer_;
    LineQueue from_peer_;
    QueueChannel mine_;
    QueueChannel theirs_;
    std::thread thread_;
};

class ProcessPeer final : public Peer {
 public:
    static StatusOr<std::unique_ptr<ProcessPeer>> spawn(const NetBenchOptions& o) {
        int to_child[2];
        int from_child[2];
        if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
            return errno_status(errno, "pipe");
        }
        std::vector<std::string> args = {"/proc/self/exe",
                                         "bench",
                                         "net",
                                         "--serve",
                                         "--nsocks",
                                         std::to_string(o.nsocks),
                                         "--io-threads",
                                         std::to_string(o.io_threads),
                                         "--interface",
                                         o.interface};
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
        posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
        pid_t pid = -1;
        const int rc =
            ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
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
    ~ProcessPeer() override {
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
    Channel* channel() override { return &channel_; }

 private:
    ProcessPeer(pid_t pid, int in, int out) : pid_(pid), in_(in), out_(out), channel_(in, out) {}
    pid_t pid_;
    int in_;
    int out_;
    FdChannel channel_;
};

// --- the initiator's measurements
// --------------------------------------------------------------------

struct Throughput {
    double gbps = 0;
    uint64_t iters = 0;
    double seconds = 0;
};

struct Latency {
    double p50_us = 0;
    double p99_us = 0;
    double mean_us = 0;
    uint64_t iters = 0;
};

Latency summarize(std::vector<double> rtts_us) {
    Latency out;
    if (rtts_us.empty()) return out;
    std::sort(rtts_us.begin(), rtts_us.end());
    const size_t n = rtts_us.size();
    out.p50_us = rtts_us[n / 2];
    out.p99_us = rtts_us[std::min(n - 1, n * 99 / 100)];
    double sum = 0;
    for (double v : rtts_us) sum += v;
    out.mean_us = sum / static_cast<double>(n);
    out.iters = n;
    return out;
}

class Initiator {
 public:
    Initiator(net::Net* net, Peer* peer, const NetBenchOptions& options)
        : net_(net), peer_(peer), options_(options) {}
    ~Initiator() {
        if (send_ != nullptr) (void)net_->close_send(send_);
        if (recv_ != nullptr) (void)net_->close_recv(recv_);
        if (listen_ != nullptr) (void)net_->close_listen(listen_);
    }

    Status setup() {
        // Our comms: initiator -> peer (measured), peer -> initiator (ping-pong replies).
        TCPX_ASSIGN_OR_RETURN(std::string reply, peer_->call("listen"));
        if (reply.rfind("handle ", 0) != 0) return protocol_error("peer: " + reply);
        TCPX_ASSIGN_OR_RETURN(net::Handle theirs, parse_handle(reply.substr(7)));
        net::Handle ours;
        TCPX_RETURN_IF_ERROR(net_->listen(0, &ours, &listen_));
        TCPX_RETURN_IF_ERROR(
            peer_->send("connect " + to_hex(ours.bytes.data(), ours.bytes.size())));
        TCPX_RETURN_IF_ERROR(connect_both(net_, &theirs, &send_, listen_, &recv_));
        TCPX_RETURN_IF_ERROR(peer_->reply().status());
        if (!options_.baseline) return Status();
        // Raw TCP: nsocks streams plus one ping-pong socket.
        TCPX_ASSIGN_OR_RETURN(reply, peer_->call("raw-listen"));
        const auto w = words(reply);
        if (w.size() != 3 || w[0] != "port") return protocol_error("peer: " + reply);
        TCPX_ASSIGN_OR_RETURN(SocketAddress addr,
                              SocketAddress::parse(w[2], static_cast<uint16_t>(std::stoi(w[1]))));
        TCPX_RETURN_IF_ERROR(peer_->send("raw-accept"));
        for (int i = 0; i <= options_.nsocks; ++i) {
            TCPX_ASSIGN_OR_RETURN(Fd fd, connect_blocking(addr, 10000));
            TCPX_RETURN_IF_ERROR(set_nodelay(fd.get()));
            const uint32_t index = static_cast<uint32_t>(i);
            TCPX_RETURN_IF_ERROR(send_all(fd.get(), &index, sizeof(index)));
            raw_.push_back(std::move(fd));
        }
        return peer_->reply().status();
    }

    // Streams `count` messages of `size` with `window` in flight; timed until the peer has all.
    StatusOr<double> ours_stream(uint64_t size, uint64_t count) {
        ensure_buffer(size);
        const int window = window_for(size);
        TCPX_RETURN_IF_ERROR(peer_->send("stream " + std::to_string(size) + " " +
                                         std::to_string(count) + " " + std::to_string(window)));
        const auto start = Clock::now();
        std::deque<net::Request*> inflight;
        for (uint64_t i = 0; i < count; ++i) {
            if (inflight.size() >= static_cast<size_t>(window)) {
                TCPX_RETURN_IF_ERROR(wait_req(net_, inflight.front()));
                inflight.pop_front();
            }
            net::Request* req = nullptr;
            TCPX_RETURN_IF_ERROR(post_send(net_, send_, buffer_.data(), size, &req));
            inflight.push_back(req);
        }
        for (net::Request* req : inflight) TCPX_RETURN_IF_ERROR(wait_req(net_, req));
        TCPX_RETURN_IF_ERROR(peer_->reply().status());
        return seconds_since(start);
    }

    StatusOr<double> raw_stream(uint64_t size, uint64_t count) {
        const int n = options_.nsocks;
        ensure_buffer(size);
        TCPX_RETURN_IF_ERROR(peer_->send("raw-stream " + std::to_string(size) + " " +
                                         std::to_string(count) + " " +
                                         std::to_string(window_for(size))));
        const auto start = Clock::now();
        TCPX_RETURN_IF_ERROR(run_threads(n, [&](int i) -> Status {
            const uint8_t* src = buffer_.data() + stream_offset(size, n, i);
            const uint64_t share = stream_share(size, n, i);
            for (uint64_t k = 0; k < count; ++k) {
                TCPX_RETURN_IF_ERROR(send_all(raw_[static_cast<size_t>(i)].get(), src, share));
            }
            return Status();
        }));
        TCPX_RETURN_IF_ERROR(peer_->reply().status());
        return seconds_since(start);
    }

    StatusOr<std::vector<double>> ours_pingpong(uint64_t size, uint64_t count) {
        ensure_buffer(2 * size);
        TCPX_ASSIGN_OR_RETURN(std::string ready, peer_->call("pingpong " + std::to_string(size) +
                                                             " " + std::to_string(count)));
        if (ready != "ready") return protocol_error("peer: " + ready);
        std::vector<double> rtts;
        rtts.reserve(count);
        uint8_t* out = buffer_.data();
        uint8_t* in = buffer_.data() + size;
        for (uint64_t i = 0; i < count; ++i) {
            const auto start = Clock::now();
            net::Request* rreq = nullptr;
            net::Request* sreq = nullptr;
            TCPX_RETURN_IF_ERROR(post_recv(net_, recv_, in, size, &rreq));
            TCPX_RETURN_IF_ERROR(post_send(net_, send_, out, size, &sreq));
            TCPX_RETURN_IF_ERROR(wait_req(net_, sreq));
            TCPX_RETURN_IF_ERROR(finish_recv(net_, recv_, rreq));
            rtts.push_back(seconds_since(start) * 1e6);
        }
        TCPX_RETURN_IF_ERROR(peer_->reply().status());
        return rtts;
    }

    StatusOr<std::vector<double>> raw_pingpong(uint64_t size, uint64_t count) {
        ensure_buffer(size);
        TCPX_RETURN_IF_ERROR(
            peer_->send("raw-pingpong " + std::to_string(size) + " " + std::to_string(count)));
        const int fd = raw_.back().get();
        std::vector<double> rtts;
        rtts.reserve(count);
        for (uint64_t i = 0; i < count; ++i) {
            const auto start = Clock::now();
            TCPX_RETURN_IF_ERROR(send_all(fd, buffer_.data(), size));
            TCPX_RETURN_IF_ERROR(recv_all(fd, buffer_.data(), size));
            rtts.push_back(seconds_since(start) * 1e6);
        }
        TCPX_RETURN_IF_ERROR(peer_->reply().status());
        return rtts;
    }

    // Warms up with growing runs until one lasts an eighth of min_seconds (connections and
    // buffers are warm then, and the rate is known), then measures for about min_seconds.
    template <typename Run>
    StatusOr<Throughput> throughput(uint64_t size, Run run) {
        constexpr uint64_t kMaxCount = 5'000'000;
        uint64_t count = std::clamp<uint64_t>((32ULL << 20) / std::max<uint64_t>(size, 1), 4, 2000);
        TCPX_ASSIGN_OR_RETURN(double t, run(size, count));
        while (t < options_.min_seconds / 8 && count < kMaxCount) {
            count = std::min(kMaxCount, count * 4);
            TCPX_ASSIGN_OR_RETURN(t, run(size, count));
        }
        const double per = std::max(t / static_cast<double>(count), 1e-9);
        count = std::clamp<uint64_t>(static_cast<uint64_t>(options_.min_seconds / per),
                                     static_cast<uint64_t>(options_.min_iters), kMaxCount);
        TCPX_ASSIGN_OR_RETURN(double seconds, run(size, count));
        Throughput out;
        out.iters = count;
        out.seconds = seconds;
        out.gbps = static_cast<double>(size) * static_cast<double>(count) / seconds / 1e9;
        return out;
    }

    // Messages in flight for `size`: the window, capped by kMaxInFlightBytes (at least 2).
    int window_for(uint64_t size) const {
        const uint64_t cap = std::max<uint64_t>(2, kMaxInFlightBytes / std::max<uint64_t>(size, 1));
        return static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(options_.window), cap));
    }

    template <typename Run>
    StatusOr<Latency> latency(uint64_t size, Run run) {
        TCPX_ASSIGN_OR_RETURN(auto warm, run(size, 20));
        double sum = 0;
        for (double v : warm) sum += v;
        const double per = std::max(sum / 20.0 / 1e6, 1e-7);
        const uint64_t count =
            std::clamp<uint64_t>(static_cast<uint64_t>(options_.min_seconds / per),
                                 static_cast<uint64_t>(options_.min_iters), 200000);
        TCPX_ASSIGN_OR_RETURN(auto rtts, run(size, count));
        return summarize(std::move(rtts));
    }

 private:
    void ensure_buffer(size_t bytes) {
        if (buffer_.size() < bytes) buffer_.assign(bytes, 0x5a);
    }

    net::Net* net_;
    Peer* peer_;
    const NetBenchOptions& options_;
    net::ListenComm* listen_ = nullptr;
    net::SendComm* send_ = nullptr;
    net::RecvComm* recv_ = nullptr;
    std::vector<uint8_t> buffer_;
    std::vector<Fd> raw_;
};

// --- reporting
// -------------------------------------------------------------------------------------

struct Row {
    uint64_t size = 0;
    Throughput ours;
    Throughput raw;
    Latency ours_lat;
    Latency raw_lat;
};

class Progress {
 public:
    explicit Progress(bool enabled) : enabled_(enabled && ::isatty(STDERR_FILENO)) {}
    void show(size_t step, size_t steps, const std::string& what) {
        if (!enabled_) return;
        std::fprintf(stderr, "\r\033[K[%zu/%zu] %s", step, steps, what.c_str());
        std::fflush(stderr);
    }
    void clear() {
        if (enabled_) std::fprintf(stderr, "\r\033[K");
    }

 private:
    bool enabled_;
};

std::string ratio(double a, double b) {
    if (b <= 0 || a <= 0) return "-";
    return strformat("%.2fx", a / b);
}

void print_table(const NetBenchOptions& o, const std::vector<Row>& rows, int io_threads) {
    std::printf(
        "tcpx-p2p bench net: socket transport vs raw TCP, %s, %d data sockets = %d raw "
        "streams, %d I/O threads, %d process%s, window %d\n",
        o.interface.c_str(), o.nsocks, o.nsocks, io_threads, o.processes,
        o.processes == 1 ? "" : "es", o.window);
    std::printf(
        "throughput in GB/s (10^9 B/s); round trip (RTT) of one message and a reply of "
        "the same size, raw over 1 stream\n\n");
    std::printf("%10s  %9s %9s %8s  %12s %12s %8s  %12s %12s\n", "size", "ours", "raw", "ours/raw",
                "ours RTT p50", "raw RTT p50", "ours/raw", "ours RTT p99", "raw RTT p99");
    for (const Row& r : rows) {
        auto gbps = [](const Throughput& t) {
            return t.iters ? strformat("%.2f", t.gbps) : std::string("-");
        };
        auto us = [](double v, uint64_t iters) {
            return iters ? strformat("%.1f us", v) : std::string("-");
        };
        std::printf("%10s  %9s %9s %8s  %12s %12s %8s  %12s %12s\n", format_bytes(r.size).c_str(),
                    gbps(r.ours).c_str(), gbps(r.raw).c_str(),
                    ratio(r.ours.gbps, r.raw.gbps).c_str(),
                    us(r.ours_lat.p50_us, r.ours_lat.iters).c_str(),
                    us(r.raw_lat.p50_us, r.raw_lat.iters).c_str(),
                    ratio(r.ours_lat.p50_us, r.raw_lat.p50_us).c_str(),
                    us(r.ours_lat.p99_us, r.ours_lat.iters).c_str(),
                    us(r.raw_lat.p99_us, r.raw_lat.iters).c_str());
    }
}

void print_json(const NetBenchOptions& o, const std::vector<Row>& rows, int io_threads) {
    using nlohmann::json;
    auto tp = [](const Throughput& t) {
        return json{{"gbps", t.gbps}, {"iters", t.iters}, {"seconds", t.seconds}};
    };
    auto lat = [](const Latency& l) {
        return json{
            {"p50_us", l.p50_us}, {"p99_us", l.p99_us}, {"mean_us", l.mean_us}, {"iters", l.iters}};
    };
    json out;
    out["benchmark"] = "net";
    out["config"] = {{"interface", o.interface}, {"nsocks", o.nsocks},
                     {"io_threads", io_threads}, {"processes", o.processes},
                     {"window", o.window},       {"min_seconds", o.min_seconds}};
    out["results"] = json::array();
    for (const Row& r : rows) {
        json row = {{"size", r.size}};
        if (r.ours.iters) row["ours"] = tp(r.ours);
        if (r.raw.iters) row["raw"] = tp(r.raw);
        if (r.ours.iters && r.raw.iters) row["throughput_ratio"] = r.ours.gbps / r.raw.gbps;
        if (r.ours_lat.iters) row["ours_rtt"] = lat(r.ours_lat);
        if (r.raw_lat.iters) row["raw_rtt"] = lat(r.raw_lat);
        if (r.ours_lat.iters && r.raw_lat.iters) {
            row["rtt_p50_ratio"] = r.ours_lat.p50_us / r.raw_lat.p50_us;
        }
        out["results"].push_back(row);
    }
    std::printf("%s\n", out.dump(2).c_str());
}

Settings bench_settings(const NetBenchOptions& o) {
    Settings s;
    auto env = Settings::from_env();
    if (env.ok()) s = *env;
    s.socket_ifname = o.interface;
    s.nsocks = o.nsocks;
    s.io_threads = o.io_threads;
    return s;
}

Status run(const NetBenchOptions& o) {
    if (o.sizes.empty()) return invalid_argument("no message sizes");
    if (o.processes != 1 && o.processes != 2) return invalid_argument("--procs must be 1 or 2");
    if (o.window < 1) return invalid_argument("--window must be at least 1");
    TCPX_ASSIGN_OR_RETURN(auto net, net::SocketNet::create(bench_settings(o)));
    std::unique_ptr<Peer> peer;
    if (o.processes == 2) {
        TCPX_ASSIGN_OR_RETURN(peer, ProcessPeer::spawn(o));
    } else {
        peer = std::make_unique<ThreadPeer>(net.get(), o);
    }
    std::vector<Row> rows;
    {
        Initiator init(net.get(), peer.get(), o);
        TCPX_RETURN_IF_ERROR(init.setup().with_context("setting up"));
        Progress progress(o.progress && !o.json);
        const size_t per_size =
            1 + (o.baseline ? 1 : 0) + (o.latency ? 1 + (o.baseline ? 1 : 0) : 0);
        const size_t steps = o.sizes.size() * per_size;
        size_t step = 0;
        for (uint64_t size : o.sizes) {
            Row row;
            row.size = size;
            const std::string sz = format_bytes(size);
            progress.show(++step, steps, sz + ": ours, throughput");
            TCPX_ASSIGN_OR_RETURN(row.ours, init.throughput(size, [&](uint64_t s, uint64_t c) {
                return init.ours_stream(s, c);
            }));
            if (o.baseline) {
                progress.show(++step, steps, sz + ": raw TCP, throughput");
                TCPX_ASSIGN_OR_RETURN(row.raw, init.throughput(size, [&](uint64_t s, uint64_t c) {
                    return init.raw_stream(s, c);
                }));
            }
            if (o.latency) {
                progress.show(++step, steps, sz + ": ours, round trips");
                TCPX_ASSIGN_OR_RETURN(row.ours_lat, init.latency(size, [&](uint64_t s, uint64_t c) {
                    return init.ours_pingpong(s, c);
                }));
                if (o.baseline) {
                    progress.show(++step, steps, sz + ": raw TCP, round trips");
                    TCPX_ASSIGN_OR_RETURN(row.raw_lat,
                                          init.latency(size, [&](uint64_t s, uint64_t c) {
                                              return init.raw_pingpong(s, c);
                                          }));
                }
            }
            rows.push_back(row);
        }
        progress.clear();
    }
    if (o.json) {
        print_json(o, rows, net->io_threads());
    } else {
        print_table(o, rows, net->io_threads());
    }
    return Status();
}

}  // namespace

int run_net_bench(const NetBenchOptions& options) {
    ::signal(SIGPIPE, SIG_IGN);
    Status st = run(options);
    if (!st.ok()) {
        std::fprintf(stderr, "tcpx-p2p bench net: %s\n", st.to_string().c_str());
        return 1;
    }
    return 0;
}

int serve_net_bench(const NetBenchOptions& options) {
    ::signal(SIGPIPE, SIG_IGN);
    auto net = net::SocketNet::create(bench_settings(options));
    FdChannel channel(STDIN_FILENO, STDOUT_FILENO);
    if (!net.ok()) {
        channel.write_line("error " + net.status().to_string());
        return 1;
    }
    Responder responder(net->get(), options);
    Status st = responder.serve(&channel);
    return st.ok() ? 0 : 1;
}

}  // namespace tcpx::bench
