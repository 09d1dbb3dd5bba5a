#include "bench/harness/raw_tcp.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <thread>
#include <utility>

#include "bench/harness/measure.h"
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

// `streams` stream connections then one ping-pong connection, each announcing its index; all
// within wait_ms_, and each connection's later sends and receives fail after wait_ms_ without
// progress (SO_SNDTIMEO, SO_RCVTIMEO).
Status RawTcpResponder::accept(int streams) {
    if (!listen_.valid()) return failed_precondition("raw-accept before raw-listen");
    if (streams < 1 || streams > kMaxStreams) {
        return invalid_argument(strformat("raw-accept: streams not in 1..%d", kMaxStreams));
    }
    conns_.clear();
    std::vector<Fd> conns(static_cast<size_t>(streams) + 1);
    const auto deadline = Clock::now() + std::chrono::milliseconds(wait_ms_);
    const timeval progress{wait_ms_ / 1000, (wait_ms_ % 1000) * 1000};
    for (int i = 0; i <= streams;) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        pollfd pfd{listen_.get(), POLLIN, 0};
        const int ready = ::poll(&pfd, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
        if (ready < 0 && errno == EINTR) continue;
        if (ready < 0) return errno_status(errno, "raw-accept: poll");
        if (ready == 0) {
            return timeout_error(
                strformat("raw-accept: %d of %d connections in %d ms", i, streams + 1, wait_ms_));
        }
        Fd fd(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (!fd.valid()) return errno_status(errno, "accept");
        if (::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &progress, sizeof(progress)) != 0 ||
            ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &progress, sizeof(progress)) != 0) {
            return errno_status(errno, "raw-accept: setsockopt");
        }
        uint32_t index = 0;
        TCPX_RETURN_IF_ERROR(recv_all(fd.get(), &index, sizeof(index)));
        if (index >= conns.size() || conns[index].valid()) {
            return protocol_error("bad raw stream index");
        }
        TCPX_RETURN_IF_ERROR(set_nodelay(fd.get()));
        conns[index] = std::move(fd);
        ++i;
    }
    conns_ = std::move(conns);
    return Status();
}

Status RawTcpResponder::stream(uint64_t size, uint64_t count, uint64_t slots, bool send,
                               const BufferFn& buffer) {
    if (conns_.size() < 2) return failed_precondition("raw-stream before raw-accept");
    if (slots == 0) return invalid_argument("raw-stream: no slots");
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

}  // namespace tcpx::bench
