#include "bench/net_bench.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "bench/harness/measure.h"
#include "bench/harness/raw_tcp.h"
#include "bench/harness/report.h"
#include "bench/harness/roles.h"
#include "common/socket.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "net/socket/socket_net.h"

namespace tcpx::bench {
namespace {

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

// --- the responder
// ---------------------------------------------------------------------------------

// Serves the initiator's commands: the receiving end of every measurement.
class Responder {
 public:
    Responder(net::Net* net, const NetBenchOptions& options) : net_(net), raw_(options.interface) {}
    ~Responder() { close(); }

    // Runs until "quit" or a broken channel.
    Status serve(Channel* ch) {
        // The raw baseline receives into the same buffers as our streams.
        const RawTcpResponder::BufferFn raw_buffer = [this](uint64_t bytes) -> StatusOr<uint8_t*> {
            TCPX_RETURN_IF_ERROR(ensure_buffer(bytes));
            return buffer_.data();
        };
        return serve_commands(
            ch,
            [&](const std::vector<std::string>& w, const std::string& line, std::string* reply) {
                Status st;
                if (w[0] == "listen") {
                    st = listen(reply);
                } else if (w[0] == "connect" && w.size() == 2) {
                    st = connect(w[1]);
                } else if (w[0] == "stream" && w.size() == 4) {
                    uint64_t size = 0;
                    uint64_t count = 0;
                    int window = 0;
                    st = parse_uint(w[1], kNetMaxMessage, &size) &&
                                 parse_uint(w[2], UINT64_MAX, &count) &&
                                 parse_int(w[3], 1, 4096, &window)
                             ? stream(size, count, window)
                             : invalid_argument("malformed command: " + line);
                } else if (w[0] == "pingpong" && w.size() == 3) {
                    uint64_t size = 0;
                    uint64_t count = 0;
                    st = parse_uint(w[1], kNetMaxMessage, &size) &&
                                 parse_uint(w[2], UINT64_MAX, &count)
                             ? pingpong(ch, size, count)
                             : invalid_argument("malformed command: " + line);
                } else if (!raw_.handle(w, raw_buffer, &st, reply)) {
                    st = invalid_argument("unknown command: " + line.substr(0, 200));
                }
                return st;
            },
            [this] { close(); });
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

    void close() {
        if (send_ != nullptr) (void)net_->close_send(send_);
        if (recv_ != nullptr) (void)net_->close_recv(recv_);
        if (listen_ != nullptr) (void)net_->close_listen(listen_);
        send_ = nullptr;
        recv_ = nullptr;
        listen_ = nullptr;
        raw_.close();
    }

    net::Net* net_;
    net::ListenComm* listen_ = nullptr;
    net::SendComm* send_ = nullptr;  // responder -> initiator (ping-pong replies)
    net::RecvComm* recv_ = nullptr;  // initiator -> responder
    std::vector<uint8_t> buffer_;
    RawTcpResponder raw_;
};

// --- the initiator's measurements
// --------------------------------------------------------------------

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
        return raw_.connect(peer_, options_.nsocks);
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

    // The raw baseline: we send from one buffer, the peer receives into `window` buffers.
    StatusOr<double> raw_stream(uint64_t size, uint64_t count) {
        ensure_buffer(size);
        return raw_.stream(peer_, true, size, count, buffer_.data(), 1,
                           static_cast<uint64_t>(window_for(size)));
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
        return raw_.pingpong(peer_, size, size, count, buffer_.data());
    }

    // Messages in flight for `size`: the window, capped by kMaxInFlightBytes (at least 2).
    int window_for(uint64_t size) const {
        const uint64_t cap = std::max<uint64_t>(2, kMaxInFlightBytes / std::max<uint64_t>(size, 1));
        return static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(options_.window), cap));
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
    RawTcpInitiator raw_;
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

std::vector<Column<Row>> table_columns() {
    auto ours_raw = [](const Row& r) { return ratio(r.ours.gbps, r.raw.gbps); };
    auto rtt_ratio = [](const Row& r) { return ratio(r.ours_lat.p50_us, r.raw_lat.p50_us); };
    return {
        {0, 10, "size", [](const Row& r) { return format_bytes(r.size); }},
        {2, 9, "ours", [](const Row& r) { return gbps_cell(r.ours); }},
        {1, 9, "raw", [](const Row& r) { return gbps_cell(r.raw); }},
        {1, 8, "ours/raw", ours_raw},
        {2, 12, "ours RTT p50",
         [](const Row& r) { return usecs_cell(r.ours_lat.p50_us, r.ours_lat.iters); }},
        {1, 12, "raw RTT p50",
         [](const Row& r) { return usecs_cell(r.raw_lat.p50_us, r.raw_lat.iters); }},
        {1, 8, "ours/raw", rtt_ratio},
        {2, 12, "ours RTT p99",
         [](const Row& r) { return usecs_cell(r.ours_lat.p99_us, r.ours_lat.iters); }},
        {1, 12, "raw RTT p99",
         [](const Row& r) { return usecs_cell(r.raw_lat.p99_us, r.raw_lat.iters); }},
    };
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
    const auto cols = table_columns();
    std::printf("%s\n", table_head(cols).c_str());
    for (const Row& r : rows) std::printf("%s\n", table_row(cols, r).c_str());
}

void print_json(const NetBenchOptions& o, const std::vector<Row>& rows, int io_threads) {
    using nlohmann::json;
    auto tp = [](const Throughput& t) { return throughput_json(t, "iters", t.iters, false); };
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
        if (r.ours_lat.iters) row["ours_rtt"] = latency_json(r.ours_lat);
        if (r.raw_lat.iters) row["raw_rtt"] = latency_json(r.raw_lat);
        if (r.ours_lat.iters && r.raw_lat.iters) {
            row["rtt_p50_ratio"] = r.ours_lat.p50_us / r.raw_lat.p50_us;
        }
        out["results"].push_back(row);
    }
    std::printf("%s\n", json_text(out, 2).c_str());
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
    for (uint64_t size : o.sizes) {
        if (size == 0 || size > kNetMaxMessage) {
            return invalid_argument(strformat("--sizes: %s is not in 1 B..%s",
                                              format_bytes(size).c_str(),
                                              format_bytes(kNetMaxMessage).c_str()));
        }
    }
    if (o.processes != 1 && o.processes != 2) return invalid_argument("--procs must be 1 or 2");
    if (o.window < 1) return invalid_argument("--window must be at least 1");
    TCPX_ASSIGN_OR_RETURN(auto net, net::SocketNet::create(bench_settings(o)));
    std::unique_ptr<Peer> peer;
    if (o.processes == 2) {
        TCPX_ASSIGN_OR_RETURN(
            peer, ProcessPeer::spawn({"bench", "net", "--serve", "--nsocks",
                                      std::to_string(o.nsocks), "--io-threads",
                                      std::to_string(o.io_threads), "--interface", o.interface}));
    } else {
        net::Net* n = net.get();
        peer = std::make_unique<ThreadPeer>([n, &o](Channel* ch) {
            Responder responder(n, o);
            (void)responder.serve(ch);
        });
    }
    std::vector<Row> rows;
    {
        Initiator init(net.get(), peer.get(), o);
        TCPX_RETURN_IF_ERROR(init.setup().with_context("setting up"));
        const size_t per_size =
            1 + (o.baseline ? 1 : 0) + (o.latency ? 1 + (o.baseline ? 1 : 0) : 0);
        Progress progress(o.progress && !o.json, o.sizes.size() * per_size);
        Calibration cal;
        cal.min_seconds = o.min_seconds;
        cal.min_iters = static_cast<uint64_t>(o.min_iters);
        Sweep sweep(cal, &progress);
        for (uint64_t size : o.sizes) {
            Row row;
            row.size = size;
            const std::string sz = format_bytes(size);
            TCPX_ASSIGN_OR_RETURN(
                row.ours, sweep.throughput(sz + ": ours, throughput", size,
                                           [&](uint64_t c) { return init.ours_stream(size, c); }));
            if (o.baseline) {
                TCPX_ASSIGN_OR_RETURN(
                    row.raw, sweep.throughput(sz + ": raw TCP, throughput", size, [&](uint64_t c) {
                        return init.raw_stream(size, c);
                    }));
            }
            if (o.latency) {
                TCPX_ASSIGN_OR_RETURN(row.ours_lat,
                                      sweep.latency(sz + ": ours, round trips", [&](uint64_t c) {
                                          return init.ours_pingpong(size, c);
                                      }));
                if (o.baseline) {
                    TCPX_ASSIGN_OR_RETURN(
                        row.raw_lat, sweep.latency(sz + ": raw TCP, round trips", [&](uint64_t c) {
                            return init.raw_pingpong(size, c);
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
        refuse_commands(&channel, net.status());
        return 1;
    }
    Responder responder(net->get(), options);
    Status st = responder.serve(&channel);
    return st.ok() ? 0 : 1;
}

}  // namespace tcpx::bench
