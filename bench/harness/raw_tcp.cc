#include "bench/harness/raw_tcp.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "bench/harness/measure.h"
#include "common/random.h"
#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::bench {

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

namespace {

// Sends and receives on `fd` fail after `ms` without progress (SO_SNDTIMEO, SO_RCVTIMEO).
Status set_progress_timeout(int fd, int ms, const char* what) {
    const timeval progress{ms / 1000, (ms % 1000) * 1000};
    if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &progress, sizeof(progress)) != 0 ||
        ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &progress, sizeof(progress)) != 0) {
        return errno_status(errno, std::string(what) + ": setsockopt");
    }
    return Status();
}

// The ping-pongs' receive: polls the socket (MSG_DONTWAIT, yielding between tries) instead of
// sleeping in recv(), as the engine's and the transport's waiting calls poll before they sleep,
// so that raw TCP's latency is its best rather than a wakeup's (on a 2-core VM a blocking
// ping-pong of 64 KiB took 100 us where a polling one takes about a third). Fails after `ms`
// without a byte, as SO_RCVTIMEO fails the blocking calls.
Status recv_all_polling(int fd, uint8_t* p, size_t len, int ms) {
    auto last = Clock::now();
    while (len > 0) {
        bool eof = false;
        TCPX_ASSIGN_OR_RETURN(const size_t n, recv_some(fd, p, len, &eof));
        if (eof) return unavailable("connection closed by peer");
        if (n > 0) {
            p += n;
            len -= n;
            last = Clock::now();
        } else if (Clock::now() - last > std::chrono::milliseconds(ms)) {
            return errno_status(EAGAIN, "recv");
        } else {
            std::this_thread::yield();
        }
    }
    return Status();
}

// The `count` numbers of a raw-* command (w[1..count]), or which is not one.
Status raw_numbers(const std::vector<std::string>& w, size_t count, std::vector<uint64_t>* out) {
    out->clear();
    for (size_t i = 1; i <= count; ++i) {
        uint64_t v = 0;
        if (!parse_uint(w[i], UINT64_MAX, &v)) {
            return invalid_argument(w[0] + ": '" + w[i].substr(0, 40) + "' is not a number");
        }
        out->push_back(v);
    }
    return Status();
}

}  // namespace

bool RawTcpResponder::handle(const std::vector<std::string>& w, const BufferFn& buffer, Status* st,
                             std::string* reply) {
    if (w.empty()) return false;
    std::vector<uint64_t> n;
    if (w[0] == "raw-listen") {
        *st = listen(reply);
    } else if (w[0] == "raw-accept" && w.size() == 2) {
        int streams = 0;
        *st = parse_int(w[1], INT_MIN, INT_MAX, &streams)
                  ? accept(streams)
                  : invalid_argument("raw-accept: '" + w[1].substr(0, 40) + "' is not a number");
    } else if (w[0] == "raw-stream" && (w.size() == 4 || (w.size() == 5 && w[4] == "send"))) {
        const bool send = w.size() == 5;
        *st = raw_numbers(w, 3, &n);
        if (st->ok()) *st = stream(n[0], n[1], n[2], send, buffer);
    } else if (w[0] == "raw-pingpong" && (w.size() == 3 || w.size() == 4)) {
        *st = raw_numbers(w, w.size() - 1, &n);
        if (st->ok()) *st = pingpong(n[0], n[1], n.size() == 3 ? n[2] : n[0], buffer);
    } else {
        return false;
    }
    return true;
}

Status RawTcpResponder::listen(std::string* reply) {
    TCPX_ASSIGN_OR_RETURN(auto ifs, find_interfaces(interface_, AddressFamily::kAny));
    TCPX_ASSIGN_OR_RETURN(listen_, listen_tcp(ifs[0].address, 128));
    // Non-blocking: a connection reset between poll and accept must not block accept.
    TCPX_RETURN_IF_ERROR(set_nonblocking(listen_.get(), true));
    TCPX_ASSIGN_OR_RETURN(SocketAddress addr, local_address(listen_.get()));
    // A token per listener, which its connections must send first: a stray connection (or one
    // left over from an earlier listener) cannot take a stream's place.
    token_.clear();
    while (token_.size() < kRawTokenBytes) {
        TCPX_ASSIGN_OR_RETURN(uint64_t r, random_u64());
        token_.append(reinterpret_cast<const char*>(&r), sizeof(r));
    }
    *reply =
        "port " + std::to_string(addr.port()) + " " + addr.host_string() + " " + hex_blob(token_);
    return Status();
}

// `streams` stream connections then one ping-pong connection, each sending the token and its
// index first; all within wait_ms_, and each connection's later sends and receives fail after
// wait_ms_ without progress (SO_SNDTIMEO, SO_RCVTIMEO). The connections say who they are in any
// order and at any pace: a slow or silent one holds no other up, and one that says something
// else is closed.
Status RawTcpResponder::accept(int streams) {
    if (!listen_.valid()) return failed_precondition("raw-accept before raw-listen");
    if (streams < 1 || streams > kMaxStreams) {
        return invalid_argument(strformat("raw-accept: streams not in 1..%d", kMaxStreams));
    }
    conns_.clear();
    std::vector<Fd> conns(static_cast<size_t>(streams) + 1);
    struct Pending {
        Fd fd;
        std::string got;  // of its preamble
    };
    std::vector<Pending> pending;
    const auto deadline = Clock::now() + std::chrono::milliseconds(wait_ms_);
    int accepted = 0;
    int refused = 0;
    std::vector<pollfd> pfds;
    while (accepted <= streams) {
        const auto left =
            std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) {
            return timeout_error(strformat("raw-accept: %d of %d connections in %d ms (%d refused)",
                                           accepted, streams + 1, wait_ms_, refused));
        }
        pfds.assign(1, pollfd{listen_.get(), POLLIN, 0});
        for (const Pending& p : pending) pfds.push_back(pollfd{p.fd.get(), POLLIN, 0});
        const int ready = ::poll(pfds.data(), pfds.size(), static_cast<int>(left));
        if (ready < 0 && errno == EINTR) continue;
        if (ready < 0) return errno_status(errno, "raw-accept: poll");
        // Those that said something: whole preambles are judged, the rest wait for more.
        for (size_t k = pending.size(); k-- > 0;) {
            if (pfds[k + 1].revents == 0) continue;
            Pending& p = pending[k];
            char buf[kRawPreambleBytes];
            const ssize_t n = ::recv(p.fd.get(), buf, kRawPreambleBytes - p.got.size(), 0);
            if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
            if (n > 0) p.got.append(buf, static_cast<size_t>(n));
            if (n > 0 && p.got.size() < kRawPreambleBytes) continue;
            uint32_t index = 0;
            if (n > 0) std::memcpy(&index, p.got.data() + kRawTokenBytes, sizeof(index));
            const bool good = n > 0 && p.got.compare(0, kRawTokenBytes, token_) == 0 &&
                              index < conns.size() && !conns[index].valid();
            if (good) {
                TCPX_RETURN_IF_ERROR(set_nonblocking(p.fd.get(), false));
                TCPX_RETURN_IF_ERROR(set_progress_timeout(p.fd.get(), wait_ms_, "raw-accept"));
                TCPX_RETURN_IF_ERROR(set_nodelay(p.fd.get()));
                conns[index] = std::move(p.fd);
                ++accepted;
            } else {
                ++refused;  // closed, or not one of ours: closed
            }
            pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(k));
        }
        if ((pfds[0].revents & POLLIN) == 0) continue;
        Fd fd(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (!fd.valid()) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK ||
                errno == ECONNABORTED) {
                continue;
            }
            return errno_status(errno, "raw-accept: accept");
        }
        if (pending.size() >= kMaxPending) {
            pending.erase(pending.begin());  // the oldest has had the longest to say something
            ++refused;
        }
        pending.push_back(Pending{std::move(fd), {}});
    }
    conns_ = std::move(conns);
    return Status();
}

Status RawTcpResponder::stream(uint64_t size, uint64_t count, uint64_t slots, bool send,
                               const BufferFn& buffer) {
    if (conns_.size() < 2) return failed_precondition("raw-stream before raw-accept");
    if (slots == 0) return invalid_argument("raw-stream: no slots");
    // Bounded as a transfer's run is: empty messages move nothing and would never block, so a
    // count of 2^64 of them spun every stream's thread for good, the commands unread.
    if (size == 0 || count > kMaxRunCount) {
        return invalid_argument(strformat("raw-stream: size 0, or count over %llu",
                                          static_cast<unsigned long long>(kMaxRunCount)));
    }
    // The buffer holds size x slots bytes: a product that wraps would ask for a small buffer and
    // then receive far outside it.
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(size, slots, &bytes)) {
        return invalid_argument("raw-stream: size x slots overflows");
    }
    TCPX_ASSIGN_OR_RETURN(uint8_t * buf, buffer(bytes));
    return move_streams(conns_, static_cast<int>(conns_.size()) - 1, send, size, count, buf, slots);
}

Status RawTcpResponder::pingpong(uint64_t size, uint64_t count, uint64_t reply,
                                 const BufferFn& buffer) {
    if (conns_.size() < 2) return failed_precondition("raw-pingpong before raw-accept");
    if (size == 0 || count > kMaxRunCount) {  // (as raw-stream)
        return invalid_argument(strformat("raw-pingpong: size 0, or count over %llu",
                                          static_cast<unsigned long long>(kMaxRunCount)));
    }
    TCPX_ASSIGN_OR_RETURN(uint8_t * buf, buffer(std::max(size, reply)));
    const int fd = conns_.back().get();
    for (uint64_t i = 0; i < count; ++i) {
        TCPX_RETURN_IF_ERROR(recv_all_polling(fd, buf, size, wait_ms_));
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
    uint64_t port = 0;
    std::string token;
    if (w.size() != 4 || w[0] != "port" || !parse_uint(w[1], 65535, &port) || port == 0 ||
        !unhex_blob(w[3], &token) || token.size() != kRawTokenBytes) {
        return protocol_error("peer: expected \"port <1..65535> <host> <token>\", got: " +
                              reply.substr(0, 200));
    }
    StatusOr<SocketAddress> addr = SocketAddress::parse(w[2], static_cast<uint16_t>(port));
    if (!addr.ok()) {
        return protocol_error("peer: not an address in \"" + reply.substr(0, 200) +
                              "\": " + addr.status().to_string());
    }
    TCPX_RETURN_IF_ERROR(peer->send("raw-accept " + std::to_string(streams)));
    for (int i = 0; i <= streams; ++i) {
        TCPX_ASSIGN_OR_RETURN(Fd fd, connect_blocking(*addr, 10000));
        // A responder that stops, or a host that vanishes, fails the measurement instead of
        // holding send_all / recv_all for ever.
        TCPX_RETURN_IF_ERROR(set_progress_timeout(fd.get(), wait_ms_, "raw TCP baseline"));
        TCPX_RETURN_IF_ERROR(set_dead_peer_timeout(fd.get(), 30000));
        TCPX_RETURN_IF_ERROR(set_nodelay(fd.get()));
        const uint32_t index = static_cast<uint32_t>(i);
        std::string preamble = token;
        preamble.append(reinterpret_cast<const char*>(&index), sizeof(index));
        TCPX_RETURN_IF_ERROR(send_all(fd.get(), preamble.data(), preamble.size()));
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
        TCPX_RETURN_IF_ERROR(recv_all_polling(fd, buf, back, wait_ms_));
        rtts.push_back(seconds_since(start) * 1e6);
    }
    TCPX_RETURN_IF_ERROR(peer->reply().status());
    return rtts;
}

}  // namespace tcpx::bench
