// `tcpx-p2p bench engine`: the transfer engine against raw TCP over loopback.
//
// The initiator (this process) owns one endpoint and connects it to `peers` target endpoints,
// which live in the responder: a thread of this process (--procs 1) or a child process
// (--procs 2). Targets need no application action for one-sided transfers; the responder only
// creates the endpoints, registers their memory and hands out the metadata and memory
// descriptors (hex on the line channel), and prepares and checks bytes for --verify.
//
// Memory per peer, here and there: (concurrency + 1) slots of batch x size bytes. Transfers in
// flight use distinct slots; the last transfer of every measurement uses the extra slot, which is
// prepared before it (source patterned with a per-measurement seed, destination poisoned) and
// checked after it with --verify.
//
// With --mem vram every peer has that memory twice on each side: GPU memory (the initiator's on
// one GPU, the targets' on another or the same) for the measured transfers, and host memory for
// the raw TCP baseline and for the same transfers between host memory (the host figures). Both
// are registered with the same endpoints, so the two figures differ only in the memory.
#include "bench/engine_bench.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "bench/harness/measure.h"
#include "bench/harness/raw_tcp.h"
#include "bench/harness/report.h"
#include "bench/harness/roles.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "tcpx/config.h"
#include "tcpx/endpoint.h"

namespace tcpx::bench {
namespace {

// The small message of the raw latency baseline: about the size of the engine's WRITE
// acknowledgement or READ request (a header, a transfer id, a status or one segment).
constexpr uint64_t kSmallMessage = 32;

// A transfer that has not finished after this long means the engine is stuck.
constexpr auto kStallTimeout = std::chrono::seconds(60);

enum class Op { kWrite, kRead };

const char* op_name(Op op) { return op == Op::kWrite ? "WRITE" : "READ"; }

// --stats: the counters as one line of numbers (the target's reply), and the sum of several.
constexpr uint64_t Stats::*kStatFields[] = {&Stats::bytes_sent,
                                            &Stats::bytes_received,
                                            &Stats::transfers_started,
                                            &Stats::transfers_completed,
                                            &Stats::transfers_failed,
                                            &Stats::requests_served,
                                            &Stats::errors,
                                            &Stats::retries,
                                            &Stats::window_blocked_ns};
constexpr const char* kStatNames[] = {"bytes_sent",
                                      "bytes_received",
                                      "transfers_started",
                                      "transfers_completed",
                                      "transfers_failed",
                                      "requests_served",
                                      "errors",
                                      "retries",
                                      "window_blocked_ns"};

Stats sum_stats(const std::vector<std::unique_ptr<Endpoint>>& eps) {
    Stats total;
    for (const auto& ep : eps) {
        const Stats s = ep->stats();
        for (auto f : kStatFields) total.*f += s.*f;
    }
    return total;
}

std::string stats_line(const Stats& s) {
    std::string out = "stats";
    for (auto f : kStatFields) out += " " + std::to_string(s.*f);
    return out;
}

StatusOr<Stats> parse_stats_line(const std::string& line) {
    const auto w = words(line);
    if (w.size() != 1 + std::size(kStatFields) || w[0] != "stats") {
        return protocol_error("peer: expected \"stats\" and " +
                              std::to_string(std::size(kStatFields)) +
                              " numbers, got: " + line.substr(0, 200));
    }
    Stats s;
    for (size_t i = 0; i < std::size(kStatFields); ++i) {
        const std::string& v = w[i + 1];
        if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || v.size() > 20) {
            return protocol_error("peer: a counter that is not a number: " + v.substr(0, 40));
        }
        s.*kStatFields[i] = std::stoull(v);
    }
    return s;
}

// Which side of the benchmark an endpoint is on: the index of its GPU in --gpus.
enum Side { kInitiatorSide = 0, kTargetSide = 1 };

// The settings of one side's endpoints. With --mem vram they serve that side's GPU: the engine
// makes it current before transports allocate per-connection GPU memory.
StatusOr<Config> bench_config(const EngineBenchOptions& o, Side side) {
    TCPX_ASSIGN_OR_RETURN(Config c, Config::from_env());
    if (o.mem == MemType::kVram && o.gpus.size() == 2) c.gpu_index = o.gpus[side];
    TCPX_RETURN_IF_ERROR(c.set("SOCKET_IFNAME", o.interface).with_context("--interface"));
    if (!o.channels.empty()) TCPX_RETURN_IF_ERROR(c.set("CHANNELS", o.channels));
    if (!o.nsocks.empty()) TCPX_RETURN_IF_ERROR(c.set("NSOCKS", o.nsocks));
    if (!o.chunk.empty()) TCPX_RETURN_IF_ERROR(c.set("XFER_CHUNK_SIZE", o.chunk));
    if (!o.window.empty()) TCPX_RETURN_IF_ERROR(c.set("WINDOW", o.window));
    TCPX_RETURN_IF_ERROR(c.validate());
    return c.effective();  // what runs, so that the header and the raw baseline match it
}

// --- memory ------------------------------------------------------------------------------------

bool parse_mem(const std::string& word, MemType* type) {
    if (word != "host" && word != "vram") return false;
    *type = word == "vram" ? MemType::kVram : MemType::kHost;
    return true;
}

// One T per memory type.
template <typename T>
class ByMem {
 public:
    T& operator[](MemType t) { return v_[static_cast<size_t>(t)]; }
    const T& operator[](MemType t) const { return v_[static_cast<size_t>(t)]; }

 private:
    std::array<T, 2> v_;
};

// The memory types a run registers: the measured one first; with --mem vram also host memory,
// for the raw TCP baseline and the host figures.
std::vector<MemType> mem_types(const EngineBenchOptions& o) {
    std::vector<MemType> out = {o.mem};
    if (o.mem != MemType::kHost && (o.baseline || o.host_baseline)) out.push_back(MemType::kHost);
    return out;
}

struct Region {
    Buffer buf;
    MemId mem = 0;
};

// A registered region of at least `len` bytes of `type` (on GPU `gpu`), kept when it is large
// enough already.
Status ensure_region(Endpoint* ep, Region* r, MemType type, int gpu, uint64_t len) {
    if (r->buf.size() >= len) return Status();
    if (r->mem != 0) {
        TCPX_RETURN_IF_ERROR(ep->dereg(r->mem).with_context("deregistering"));
        r->mem = 0;
    }
    r->buf = Buffer();
    TCPX_ASSIGN_OR_RETURN(r->buf, Buffer::allocate(type, gpu, len, 0x5a));
    TCPX_ASSIGN_OR_RETURN(r->mem, ep->reg(r->buf.data(), len));
    return Status();
}

// --- transfers: one loop for the initiator and, with --bidir, the targets
// -------------------------

// One stream of transfers: an endpoint, the peer it posts to, our region and the peer's.
struct Lane {
    Endpoint* ep = nullptr;
    PeerId peer = 0;
    MemId local = 0;
    RemoteMem remote;
};

// What every transfer of a measurement looks like. Slot k of a region is bytes [k, k + 1) x
// slot_bytes(); the transfers in flight use slots 0..conc-1 and the last one of a measurement
// slot conc, which --verify prepares before and checks after.
struct Shape {
    Op op = Op::kWrite;
    uint64_t size = 0;  // per piece
    int batch = 1;
    int conc = 1;
    uint64_t slot_bytes() const { return size * static_cast<uint64_t>(batch); }
};

StatusOr<XferId> post_lane(const Lane& lane, const Shape& s, int slot, std::vector<IoVec>* iov) {
    const uint64_t base = static_cast<uint64_t>(slot) * s.slot_bytes();
    if (s.batch == 1) {
        return s.op == Op::kWrite
                   ? lane.ep->write(lane.peer, lane.local, base, lane.remote, base, s.size)
                   : lane.ep->read(lane.peer, lane.local, base, lane.remote, base, s.size);
    }
    iov->resize(static_cast<size_t>(s.batch));
    for (size_t i = 0; i < iov->size(); ++i) {
        const uint64_t off = base + i * s.size;
        (*iov)[i] = IoVec{lane.local, off, lane.remote, off, s.size};
    }
    return s.op == Op::kWrite ? lane.ep->writev(lane.peer, *iov) : lane.ep->readv(lane.peer, *iov);
}

// `count` transfers on every lane, s.conc in flight on each, all lanes at once; the last one of
// every lane in slot s.conc. Returns each lane's seconds from the start until its last transfer
// completed.
StatusOr<std::vector<double>> run_lanes(const std::vector<Lane>& lanes, const Shape& s,
                                        uint64_t count) {
    const std::string what =
        strformat("%s of %s", op_name(s.op), format_bytes(s.slot_bytes()).c_str());
    // The transfer in flight in each slot of each lane.
    std::vector<std::vector<XferId>> ids(lanes.size(), std::vector<XferId>(s.conc + 1));
    // Slots whose transfer a wait() saw finish (it reports a transfer once): done() says so.
    std::vector<std::vector<char>> waited(lanes.size(), std::vector<char>(s.conc + 1, 0));
    std::vector<IoVec> iov;
    Window w;
    w.lanes = lanes.size();
    w.count = count;
    w.window = s.conc;
    w.last_slot = s.conc;
    w.stall_seconds = static_cast<double>(kStallTimeout.count());
    w.what = what;
    w.post = [&](size_t p, int slot) -> Status {
        StatusOr<XferId> id = post_lane(lanes[p], s, slot, &iov);
        if (!id.ok()) {
            return Status(id.status())
                .with_context(strformat("posting a %s, lane %zu", what.c_str(), p));
        }
        ids[p][static_cast<size_t>(slot)] = *id;
        return Status();
    };
    w.done = [&](size_t p, int slot) -> StatusOr<bool> {
        if (char& seen = waited[p][static_cast<size_t>(slot)]; seen != 0) {
            seen = 0;
            return true;
        }
        XferStatus st = lanes[p].ep->poll(ids[p][static_cast<size_t>(slot)]);
        if (st.state == XferState::kFailed) {
            return st.error.with_context(strformat("%s, lane %zu", what.c_str(), p));
        }
        return st.state == XferState::kDone;
    };
    w.wait = [&](size_t p, int slot) -> Status {
        const XferId id = ids[p][static_cast<size_t>(slot)];
        const Status st = lanes[p].ep->wait(id, std::chrono::milliseconds(1));
        if (st.ok()) {
            waited[p][static_cast<size_t>(slot)] = 1;
            return Status();
        }
        // Still in flight (the wait's own timeout; it may have finished since), or failed with
        // a timeout of its own: poll() tells them apart (a failure the wait reported is gone).
        if (st.code() == StatusCode::kTimeout) {
            const XferStatus now = lanes[p].ep->poll(id);
            if (now.state == XferState::kInProgress) return Status();
            if (now.state == XferState::kDone) {
                waited[p][static_cast<size_t>(slot)] = 1;
                return Status();
            }
            if (now.error.code() != StatusCode::kNotFound) {
                return Status(now.error).with_context(strformat("%s, lane %zu", what.c_str(), p));
            }
        }
        return Status(st).with_context(strformat("%s, lane %zu", what.c_str(), p));
    };
    return run_window(w);
}

// --- the target side (the responder) ------------------------------------------------------------

// Commands (one line each, replies "ok" unless said otherwise):
//   endpoints <n> [pergpu]         creates n endpoints (pergpu: endpoint i on GPU i)
//                                  -> "md <hex metadata>..."
//   accept <ms>                    waits until every endpoint has its peer (accept())
//   mem <type> <bytes>             a registered region of at least `bytes` of memory `type`
//                                  (host|vram) per endpoint (with --bidir two: one per direction)
//                                  -> "mem <hex descriptor>..."
//   rmem <type> <hex descriptor>...  --bidir: the initiator's regions the targets' own transfers
//                                  go to or come from, one per endpoint
//   xfer write|read <type> <count> <size> <batch> <conc> <n>   --bidir: the same transfers as the
//                                  initiator's, from the first n endpoints toward theirs, from or
//                                  into the second regions -> "secs <seconds per endpoint>..."
//   prep write|read <type> <run> <off> <len> <n> [rev]   before a verified measurement: poisons
//                                  (write) or patterns (read) [off, off + len) of the first n
//                                  regions of that type (rev: of the second regions)
//   check <type> <run> <off> <len> <n> [rev]   after one: checks the pattern there
//   kvshape <layers> <tokens> <heads> <dim> <dtype> <pool> <blocks>   the KV workload's shape
//   channels                       -> "channels <n>": the data channels its endpoints offer
//   cpu                            -> "cpu <seconds>": this process's CPU time so far
//   kvfill|kvcheck <type> <run> <request>   --verify of a KV request: patterns, or checks, the
//                                  pieces of request <request> in the first endpoint's region
//   raw-*                          the raw TCP baseline, in the first host region's memory
//   quit                           -> "bye"
// GPU memory is allocated on the GPU the endpoint serves (Config::gpu_index). On a side channel
// the commands come from the network: numbers that do not parse are an error reply, and what a
// command may make us allocate is bounded (kMaxEndpoints, kMaxSideBytes).
class Target {
 public:
    static constexpr int kMaxEndpoints = 256;
    static constexpr uint64_t kMaxSideBytes = 16ULL << 30;  // registered memory per type

    Target(Config config, const std::string& interface, bool bidir)
        : config_(std::move(config)), bidir_(bidir), raw_(interface) {}
    ~Target() { close(); }

    Status serve(Channel* ch) {
        // The raw baseline's own memory, not the engine's regions: the engine may still hold
        // a served read's last send completion (the initiator has its bytes already), and its
        // threads must never share bytes with the baseline's.
        const RawTcpResponder::BufferFn raw_buffer = [this](uint64_t bytes) -> StatusOr<uint8_t*> {
            if (bytes > kMaxSideBytes) return invalid_argument("raw TCP baseline: too large");
            if (raw_mem_.size() < bytes) raw_mem_.resize(bytes);
            return raw_mem_.data();
        };
        return serve_commands(
            ch,
            [&](const std::vector<std::string>& w, const std::string& line, std::string* reply) {
                return dispatch(w, line, raw_buffer, reply);
            },
            [this] { close(); });
    }

 private:
    Status dispatch(const std::vector<std::string>& w, const std::string& line,
                    const RawTcpResponder::BufferFn& raw_buffer, std::string* reply) {
        MemType type = MemType::kHost;
        const bool rev = w.back() == "rev";
        const size_t nw = w.size() - (rev ? 1 : 0);
        if (w[0] == "endpoints" && (w.size() == 2 || (w.size() == 3 && w[2] == "pergpu"))) {
            return endpoints(std::stoi(w[1]), w.size() == 3, reply);
        } else if (w[0] == "accept" && w.size() == 2) {
            return accept(std::stoll(w[1]));
        } else if (w[0] == "mem" && w.size() == 3 && parse_mem(w[1], &type)) {
            return mem(type, std::stoull(w[2]), reply);
        } else if (w[0] == "rmem" && w.size() >= 2 && parse_mem(w[1], &type)) {
            return rmem(type, w);
        } else if (w[0] == "xfer" && w.size() == 8 && (w[1] == "write" || w[1] == "read") &&
                   parse_mem(w[2], &type)) {
            return xfer(w, type, reply);
        } else if (w[0] == "prep" && nw == 7 && (w[1] == "write" || w[1] == "read") &&
                   parse_mem(w[2], &type)) {
            return prep(w[1] == "write", type, std::stoull(w[3]), std::stoull(w[4]),
                        std::stoull(w[5]), std::stoi(w[6]), rev);
        } else if (w[0] == "check" && nw == 6 && parse_mem(w[1], &type)) {
            return check(type, std::stoull(w[2]), std::stoull(w[3]), std::stoull(w[4]),
                         std::stoi(w[5]), rev);
        } else if (w[0] == "stats" && w.size() == 1) {
            *reply = stats_line(sum_stats(eps_));
            return Status();
        } else if (w[0] == "channels" && w.size() == 1) {
            *reply = strformat("channels %lld", static_cast<long long>(config_.channels));
            return Status();
        } else if (w[0] == "cpu" && w.size() == 1) {
            *reply = strformat("cpu %.9f", process_cpu_seconds());
            return Status();
        } else if (w[0] == "kvshape" && w.size() == 8) {
            return kv_shape(w);
        } else if ((w[0] == "kvfill" || w[0] == "kvcheck") && w.size() == 4 &&
                   parse_mem(w[1], &type)) {
            return kv_pieces(w[0] == "kvfill", type, std::stoull(w[2]), std::stoi(w[3]));
        }
        Status st;
        if (!raw_.handle(w, raw_buffer, &st, reply)) {
            return invalid_argument("unknown command: " + line.substr(0, 200));
        }
        return st;
    }

    Status endpoints(int n, bool per_gpu, std::string* reply) {
        if (!eps_.empty()) return failed_precondition("endpoints exist already");
        if (n < 1 || n > kMaxEndpoints) return invalid_argument("endpoints: n not in 1..256");
        *reply = "md";
        for (int i = 0; i < n; ++i) {
            Config c = config_;
            if (per_gpu) c.gpu_index = i;
            TCPX_ASSIGN_OR_RETURN(auto ep,
                                  Endpoint::create(c, "bench-target-" + std::to_string(i)));
            *reply += " " + hex_blob(ep->metadata());
            eps_.push_back(std::move(ep));
            gpus_.push_back(static_cast<int>(c.gpu_index));
        }
        regions_.resize(static_cast<size_t>(n));
        rev_.resize(static_cast<size_t>(n));
        remote_.resize(static_cast<size_t>(n));
        return Status();
    }

    // One-sided transfers need no accept(); the benchmark uses it to know that both ends of every
    // connection are established before it measures (see setup()), and --bidir to know the peer
    // its own transfers go to.
    Status accept(int64_t timeout_ms) {
        peers_.clear();
        for (size_t i = 0; i < eps_.size(); ++i) {
            auto peer = eps_[i]->accept(std::chrono::milliseconds(timeout_ms));
            if (!peer.ok()) {
                return Status(peer.status())
                    .with_context("target " + std::to_string(i) + ": accept");
            }
            peers_.push_back(*peer);
        }
        return Status();
    }

    Status mem(MemType type, uint64_t bytes, std::string* reply) {
        if (eps_.empty()) return failed_precondition("mem before endpoints");
        if (bytes > kMaxSideBytes / eps_.size() / (bidir_ ? 2 : 1)) {
            return invalid_argument("mem: more than 16 GiB per side");
        }
        *reply = "mem";
        for (size_t i = 0; i < eps_.size(); ++i) {
            const std::string who = "target " + std::to_string(i);
            Region& r = regions_[i][type];
            TCPX_RETURN_IF_ERROR(
                ensure_region(eps_[i].get(), &r, type, gpus_[i], bytes).with_context(who));
            if (bidir_) {
                TCPX_RETURN_IF_ERROR(
                    ensure_region(eps_[i].get(), &rev_[i][type], type, gpus_[i], bytes)
                        .with_context(who));
            }
            TCPX_ASSIGN_OR_RETURN(RemoteMem d, eps_[i]->describe(r.mem));
            *reply += " " + hex_blob(d.serialize());
        }
        return Status();
    }

    Status rmem(MemType type, const std::vector<std::string>& w) {
        if (w.size() != eps_.size() + 2)
            return invalid_argument("rmem: one descriptor per endpoint");
        for (size_t i = 0; i < eps_.size(); ++i) {
            std::string blob;
            if (!unhex_blob(w[i + 2], &blob)) return invalid_argument("rmem: bad hex");
            TCPX_ASSIGN_OR_RETURN(remote_[i][type], RemoteMem::parse(blob));
        }
        return Status();
    }

    Status xfer(const std::vector<std::string>& w, MemType type, std::string* reply) {
        Shape s;
        s.op = w[1] == "write" ? Op::kWrite : Op::kRead;
        const uint64_t count = std::stoull(w[3]);
        s.size = std::stoull(w[4]);
        s.batch = std::stoi(w[5]);
        s.conc = std::stoi(w[6]);
        const int n = std::stoi(w[7]);
        if (!bidir_) return failed_precondition("xfer without --bidir");
        TCPX_RETURN_IF_ERROR(in_range(n));
        if (peers_.size() < static_cast<size_t>(n))
            return failed_precondition("xfer before accept");
        if (s.size == 0 || s.batch < 1 || s.conc < 1 || count == 0) {
            return invalid_argument("xfer: a size, batch, concurrency or count of 0");
        }
        std::vector<Lane> lanes;
        for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
            const Region& r = rev_[i][type];
            if (r.mem == 0 || r.buf.size() < s.slot_bytes() * static_cast<uint64_t>(s.conc + 1)) {
                return failed_precondition("xfer: no region of that size");
            }
            lanes.push_back(Lane{eps_[i].get(), peers_[i], r.mem, remote_[i][type]});
        }
        TCPX_ASSIGN_OR_RETURN(std::vector<double> secs, run_lanes(lanes, s, count));
        *reply = "secs";
        for (double v : secs) *reply += strformat(" %.9f", v);
        return Status();
    }

    Status in_range(int n) const {
        if (n < 1 || static_cast<size_t>(n) > regions_.size()) {
            return invalid_argument("no such region");
        }
        return Status();
    }

    Status prep(bool write, MemType type, uint64_t run, uint64_t off, uint64_t len, int n,
                bool rev) {
        TCPX_RETURN_IF_ERROR(in_range(n));
        for (int i = 0; i < n; ++i) {
            const auto k = static_cast<size_t>(i);
            TCPX_RETURN_IF_ERROR(prepare_bytes((rev ? rev_ : regions_)[k][type].buf, off, len,
                                               !write, pattern_seed(run, i)));
        }
        return Status();
    }

    Status check(MemType type, uint64_t run, uint64_t off, uint64_t len, int n, bool rev) {
        TCPX_RETURN_IF_ERROR(in_range(n));
        for (int i = 0; i < n; ++i) {
            const auto k = static_cast<size_t>(i);
            TCPX_RETURN_IF_ERROR(check_bytes((rev ? rev_ : regions_)[k][type].buf, off, len,
                                             pattern_seed(run, i), "target " + std::to_string(i)));
        }
        return Status();
    }

    Status kv_shape(const std::vector<std::string>& w) { return parse_kv_shape_words(w, 1, &kv_); }

    Status kv_pieces(bool fill, MemType type, uint64_t run, int request) {
        TCPX_RETURN_IF_ERROR(in_range(1));
        const Buffer& b = regions_[0][type].buf;
        if (b.size() < kv_.pool) return failed_precondition("no KV pool of that memory");
        const std::vector<uint64_t> offsets = kv_offsets(kv_, kv_seed(request, KvSide::kTarget));
        return fill ? kv_fill(b, kv_, offsets, run) : kv_check(b, kv_, offsets, run, "target");
    }

    void close() {
        raw_.close();
        eps_.clear();  // before the memory they may still touch
        regions_.clear();
        rev_.clear();
    }

    Config config_;
    bool bidir_;
    KvShape kv_;
    std::vector<ByMem<Region>> regions_;    // declared before eps_: outlive them
    std::vector<ByMem<Region>> rev_;        // --bidir: the regions of the targets' own transfers
    std::vector<ByMem<RemoteMem>> remote_;  // --bidir: the initiator's, for those
    std::vector<std::unique_ptr<Endpoint>> eps_;
    std::vector<uint8_t> raw_mem_;  // the raw TCP baseline's buffer
    std::vector<int> gpus_;         // per endpoint
    std::vector<PeerId> peers_;     // per endpoint: the initiator's endpoint (accept())
    RawTcpResponder raw_;
};

// --- the initiator's measurements ---------------------------------------------------------------

class EngineInitiator {
 public:
    EngineInitiator(const EngineBenchOptions& o, const Config& config, Peer* peer)
        : o_(o), config_(config), peer_(peer) {}
    ~EngineInitiator() {
        raw_.close();
        eps_.clear();  // before the memory they may still touch
    }

    // The raw baseline's streams: as many as the engine's data sockets per peer.
    int raw_streams() const { return static_cast<int>(config_.nsocks) * channels_; }

    // Data channels per peer and direction as they run: a peer uses the smaller of the two
    // sides' counts (after setup(); each side's Config::effective() before it). An endpoint that
    // stripes its peers over several interfaces (rails, with TCPX_P2P_AUTH_SECRET) may raise its
    // own count to one per interface; the engine has no public read-out of that, so it is not
    // counted here (docs/benchmarking.md).
    int channels() const { return channels_; }

    // --stats: our endpoints' counters, and the targets' (they report them).
    Stats own_stats() const { return sum_stats(eps_); }
    StatusOr<Stats> target_stats() {
        TCPX_ASSIGN_OR_RETURN(std::string reply, peer_->call("stats"));
        return parse_stats_line(reply);
    }

    // Both sides' CPU seconds so far: the targets are threads of this process (--procs 1) or
    // another process, which reports its own.
    StatusOr<CpuTimes> cpu_seconds() { return both_cpu_seconds(peer_, o_.processes != 1); }

    // Our endpoints: one for all peers, or with --pairs one per peer (per GPU: endpoint i on
    // GPU i); the targets' endpoints, and a connection from ours to each.
    Status setup() {
        const int ours = o_.pairs ? o_.peers : 1;
        for (int i = 0; i < ours; ++i) {
            Config c = config_;
            if (o_.per_gpu) c.gpu_index = i;
            TCPX_ASSIGN_OR_RETURN(auto ep,
                                  Endpoint::create(c, "bench-initiator-" + std::to_string(i)));
            eps_.push_back(std::move(ep));
            gpus_.push_back(static_cast<int>(c.gpu_index));
        }
        TCPX_ASSIGN_OR_RETURN(
            std::string reply,
            peer_->call("endpoints " + std::to_string(o_.peers) + (o_.per_gpu ? " pergpu" : "")));
        const auto w = words(reply);
        if (w.size() != static_cast<size_t>(o_.peers) + 1 || w[0] != "md") {
            return protocol_error("peer: " + reply);
        }
        peers_.resize(static_cast<size_t>(o_.peers));
        for (int i = 0; i < o_.peers; ++i) {
            std::string md;
            if (!unhex_blob(w[static_cast<size_t>(i) + 1], &md)) {
                return protocol_error("bad metadata from peer");
            }
            PeerState& p = peers_[static_cast<size_t>(i)];
            p.ep = o_.pairs ? i : 0;
            auto id = ep(p)->connect(md);
            if (!id.ok()) {
                return Status(id.status())
                    .with_context("connecting to target " + std::to_string(i));
            }
            p.id = *id;
        }
        // What the targets' endpoints run (they may have other settings: another host's
        // environment); a target that does not say keeps ours.
        channels_ = static_cast<int>(config_.channels);
        StatusOr<std::string> theirs = peer_->call("channels");
        if (theirs.ok()) {
            const auto cw = words(*theirs);
            int n = 0;
            if (cw.size() != 2 || cw[0] != "channels" ||
                std::from_chars(cw[1].data(), cw[1].data() + cw[1].size(), n).ec != std::errc() ||
                n < 1) {
                return protocol_error("peer: " + *theirs);
            }
            channels_ = std::min(channels_, n);
        }
        // connect() returns when our side is ready; wait until the targets' sides are too before
        // the first request (the engine refuses a request that reaches a target in the middle of
        // its handshake: "WRITE_REQ before the connection was ready").
        TCPX_RETURN_IF_ERROR(
            peer_->call("accept " + std::to_string(config_.connect_timeout_ms)).status());
        if (!o_.baseline) return Status();
        return raw_.connect(peer_, raw_streams()).with_context("raw TCP baseline");
    }

    // Memory for transfers of batch pieces of `size`: the concurrency that fits, regions of every
    // memory type in use here and there, the peer's descriptors.
    Status prepare(uint64_t size) {
        size_ = size;
        slot_bytes_ = size * static_cast<uint64_t>(o_.batch);
        const uint64_t per_slot = slot_bytes_ * static_cast<uint64_t>(o_.peers);
        conc_ = static_cast<int>(
            std::min<uint64_t>(static_cast<uint64_t>(o_.concurrency),
                               std::max<uint64_t>(1, kMaxInFlightBytes / per_slot)));
        const uint64_t region = slot_bytes_ * static_cast<uint64_t>(conc_ + 1);
        const uint64_t sets = o_.bidir ? 2 : 1;  // --bidir: a region per direction
        if (region * static_cast<uint64_t>(o_.peers) * sets > (16ULL << 30)) {
            return invalid_argument(strformat("%s per side is too much memory",
                                              format_bytes(region * o_.peers * sets).c_str()));
        }
        for (MemType type : mem_types(o_)) {
            TCPX_ASSIGN_OR_RETURN(std::string reply,
                                  peer_->call(strformat("mem %s %llu", mem_name(type),
                                                        static_cast<unsigned long long>(region))));
            const auto w = words(reply);
            if (w.size() != peers_.size() + 1 || w[0] != "mem") {
                return protocol_error("peer: " + reply);
            }
            for (size_t i = 0; i < peers_.size(); ++i) {
                PeerState& p = peers_[i];
                std::string blob;
                if (!unhex_blob(w[i + 1], &blob)) return protocol_error("bad descriptor from peer");
                TCPX_ASSIGN_OR_RETURN(p.remote[type], RemoteMem::parse(blob));
                TCPX_RETURN_IF_ERROR(ensure_region(ep(p), &p.local[type], type, gpu(p), region)
                                         .with_context("initiator"));
            }
            if (!o_.bidir) continue;
            // The regions the targets' own transfers write into or read from.
            std::string rmem = strformat("rmem %s", mem_name(type));
            for (PeerState& p : peers_) {
                TCPX_RETURN_IF_ERROR(ensure_region(ep(p), &p.rev[type], type, gpu(p), region)
                                         .with_context("initiator"));
                TCPX_ASSIGN_OR_RETURN(RemoteMem d, ep(p)->describe(p.rev[type].mem));
                rmem += " " + hex_blob(d.serialize());
            }
            TCPX_RETURN_IF_ERROR(peer_->call(rmem).status());
        }
        return Status();
    }

    int concurrency() const { return conc_; }
    uint64_t slot_bytes() const { return slot_bytes_; }

    // `count` transfers between memory of `type` to each of the first `npeers` peers, conc_ in
    // flight per peer (with --bidir the targets do the same toward us at the same time); the time
    // until the last one completes. last() has each peer's and direction's.
    StatusOr<double> transfers(Op op, MemType type, int npeers, uint64_t count) {
        TCPX_RETURN_IF_ERROR(verify_prep(op, type, npeers));
        if (o_.bidir) {
            TCPX_RETURN_IF_ERROR(verify_prep_rev(op, type, npeers));
            TCPX_RETURN_IF_ERROR(peer_->send(
                strformat("xfer %s %s %llu %llu %d %d %d", op == Op::kWrite ? "write" : "read",
                          mem_name(type), static_cast<unsigned long long>(count),
                          static_cast<unsigned long long>(size_), o_.batch, conc_, npeers)));
        }
        std::vector<Lane> lanes;
        for (size_t i = 0; i < static_cast<size_t>(npeers); ++i) {
            PeerState& p = peers_[i];
            lanes.push_back(Lane{ep(p), p.id, p.local[type].mem, p.remote[type]});
        }
        StatusOr<std::vector<double>> fwd = run_lanes(lanes, shape(op), count);
        last_ = Directions();
        if (o_.bidir) {
            // The targets' answer comes when their transfers are done (or failed).
            StatusOr<std::string> reply = peer_->reply();
            if (!fwd.ok()) return fwd.status();
            if (!reply.ok()) return Status(reply.status()).with_context("the targets' transfers");
            const auto w = words(*reply);
            if (w.size() != static_cast<size_t>(npeers) + 1 || w[0] != "secs") {
                return protocol_error("peer: " + *reply);
            }
            for (size_t i = 1; i < w.size(); ++i) last_.rev.push_back(std::stod(w[i]));
        }
        if (!fwd.ok()) return fwd.status();
        last_.fwd = *fwd;
        TCPX_RETURN_IF_ERROR(verify_check(op, type, npeers));
        if (o_.bidir) TCPX_RETURN_IF_ERROR(verify_check_rev(op, type, npeers));
        double seconds = 0;
        for (double v : last_.fwd) seconds = std::max(seconds, v);
        for (double v : last_.rev) seconds = std::max(seconds, v);
        return seconds;
    }

    // Per peer, the seconds of the last transfers() in each direction (rev: with --bidir).
    struct Directions {
        std::vector<double> fwd;
        std::vector<double> rev;
    };
    const Directions& last() const { return last_; }

    // `count` transfers between memory of `type` to the first peer, one at a time: each one's
    // time from post to completion (wait), in microseconds.
    StatusOr<std::vector<double>> single_transfers(Op op, MemType type, uint64_t count) {
        TCPX_RETURN_IF_ERROR(verify_prep(op, type, 1));
        std::vector<double> us;
        us.reserve(count);
        for (uint64_t k = 0; k < count; ++k) {
            const int slot = k + 1 < count ? 0 : conc_;
            const auto start = Clock::now();
            TCPX_ASSIGN_OR_RETURN(XferId id, post(op, type, 0, slot));
            Status st = ep(peers_[0])->wait(id, kStallTimeout);
            if (!st.ok()) {
                return st.with_context(strformat("%s of %s, one at a time", op_name(op),
                                                 format_bytes(slot_bytes_).c_str()));
            }
            us.push_back(seconds_since(start) * 1e6);
        }
        TCPX_RETURN_IF_ERROR(verify_check(op, type, 1));
        return us;
    }

    // Raw TCP moving the same bytes in the same direction, as many slots of the same size, from
    // / into host memory of its own.
    StatusOr<double> raw_stream(Op op, uint64_t count) {
        const uint64_t slots = static_cast<uint64_t>(conc_);
        return raw_.stream(peer_, op == Op::kWrite, slot_bytes_, count,
                           raw_buffer(slot_bytes_ * slots), slots, slots);
    }

    // The raw request/response closest to one transfer: WRITE = the data there and an
    // acknowledgement back; READ = a request there and the data back.
    StatusOr<std::vector<double>> raw_pingpong(Op op, uint64_t count) {
        const uint64_t out = op == Op::kWrite ? slot_bytes_ : kSmallMessage;
        const uint64_t back = op == Op::kWrite ? kSmallMessage : slot_bytes_;
        return raw_.pingpong(peer_, out, back, count, raw_buffer(std::max(out, back)));
    }

    // --kv: the pools of every memory type here and there (the first peer's), and the requests.
    Status prepare_kv() {
        const KvShape& k = o_.kv_shape;
        TCPX_RETURN_IF_ERROR(peer_->call("kvshape " + kv_shape_words(k)).status());
        PeerState& p = peers_[0];
        const int gpu = this->gpu(p);
        for (MemType type : mem_types(o_)) {
            TCPX_ASSIGN_OR_RETURN(std::string reply,
                                  peer_->call(strformat("mem %s %llu", mem_name(type),
                                                        static_cast<unsigned long long>(k.pool))));
            const auto w = words(reply);
            std::string blob;
            if (w.size() != 2 || w[0] != "mem" || !unhex_blob(w[1], &blob)) {
                return protocol_error("peer: " + reply);
            }
            TCPX_ASSIGN_OR_RETURN(p.remote[type], RemoteMem::parse(blob));
            TCPX_RETURN_IF_ERROR(
                ensure_region(ep(p), &p.local[type], type, gpu, k.pool).with_context("initiator"));
            auto& requests = kv_iov_[type];
            requests.assign(kKvRequests, {});
            for (int r = 0; r < kKvRequests; ++r) {
                const auto local = kv_offsets(k, kv_seed(r, KvSide::kInitiator));
                const auto remote = kv_offsets(k, kv_seed(r, KvSide::kTarget));
                auto& iov = requests[static_cast<size_t>(r)];
                iov.reserve(local.size());
                for (size_t i = 0; i < local.size(); ++i) {
                    iov.push_back(IoVec{p.local[type].mem, local[i], p.remote[type], remote[i],
                                        k.block_bytes()});
                }
            }
        }
        return Status();
    }

    // --kv: `count` requests of memory `type`, one at a time (a decode pulling one sequence's
    // cache): each the KV request's pieces, or with `contiguous` the same bytes as one piece.
    StatusOr<double> kv_transfers(Op op, MemType type, bool contiguous, uint64_t count) {
        const auto start = Clock::now();
        for (uint64_t n = 0; n < count; ++n) {
            TCPX_ASSIGN_OR_RETURN(XferId id,
                                  post_kv(op, type, contiguous, static_cast<int>(n % kKvRequests)));
            Status st = ep(peers_[0])->wait(id, kStallTimeout);
            if (!st.ok()) return st.with_context(kv_what(op, type, contiguous));
        }
        return seconds_since(start);
    }

    // --kv --verify: one more request, its source patterned and its destination poisoned first,
    // checked after.
    Status verify_kv(Op op, MemType type, bool contiguous) {
        if (!o_.verify) return Status();
        const KvShape& k = o_.kv_shape;
        const uint64_t total = k.request_bytes();
        const Buffer& local = peers_[0].local[type].buf;
        const uint64_t run = ++run_;
        const std::string what = kv_what(op, type, contiguous);
        const std::vector<uint64_t> offsets = kv_offsets(k, kv_seed(0, KvSide::kInitiator));
        const char* mem = mem_name(type);
        const auto ull = [](uint64_t v) { return static_cast<unsigned long long>(v); };
        if (op == Op::kWrite) {
            TCPX_RETURN_IF_ERROR(contiguous
                                     ? prepare_bytes(local, 0, total, true, pattern_seed(run, 0))
                                     : kv_fill(local, k, offsets, run));
            TCPX_RETURN_IF_ERROR(peer_
                                     ->call(strformat("prep write %s %llu 0 %llu 1", mem, ull(run),
                                                      ull(contiguous ? total : k.pool)))
                                     .status());
        } else {
            TCPX_RETURN_IF_ERROR(
                peer_
                    ->call(contiguous
                               ? strformat("prep read %s %llu 0 %llu 1", mem, ull(run), ull(total))
                               : strformat("kvfill %s %llu 0", mem, ull(run)))
                    .status());
            TCPX_RETURN_IF_ERROR(prepare_bytes(local, 0, contiguous ? total : k.pool, false, 0));
        }
        TCPX_ASSIGN_OR_RETURN(XferId id, post_kv(op, type, contiguous, 0));
        TCPX_RETURN_IF_ERROR(ep(peers_[0])->wait(id, kStallTimeout).with_context(what));
        Status st;
        if (op == Op::kWrite) {
            st = peer_
                     ->call(contiguous
                                ? strformat("check %s %llu 0 %llu 1", mem, ull(run), ull(total))
                                : strformat("kvcheck %s %llu 0", mem, ull(run)))
                     .status();
        } else {
            st = contiguous ? check_bytes(local, 0, total, pattern_seed(run, 0), "initiator")
                            : kv_check(local, k, offsets, run, "initiator");
        }
        if (!st.ok()) return internal_error("VERIFICATION FAILED: " + what + ": " + st.to_string());
        return Status();
    }

 private:
    std::string kv_what(Op op, MemType type, bool contiguous) const {
        return strformat("%s of a KV request (%s memory%s)", op_name(op), mem_name(type),
                         contiguous ? ", contiguous" : "");
    }

    StatusOr<XferId> post_kv(Op op, MemType type, bool contiguous, int request) {
        PeerState& ps = peers_[0];
        Endpoint* e = ep(ps);
        StatusOr<XferId> id = Status(StatusCode::kInternal, "not posted");
        if (contiguous) {
            const uint64_t total = o_.kv_shape.request_bytes();
            id = op == Op::kWrite
                     ? e->write(ps.id, ps.local[type].mem, 0, ps.remote[type], 0, total)
                     : e->read(ps.id, ps.local[type].mem, 0, ps.remote[type], 0, total);
        } else {
            const auto& iov = kv_iov_[type][static_cast<size_t>(request)];
            id = op == Op::kWrite ? e->writev(ps.id, iov) : e->readv(ps.id, iov);
        }
        if (!id.ok()) return Status(id.status()).with_context(kv_what(op, type, contiguous));
        return id;
    }

    struct PeerState {
        PeerId id = 0;
        int ep = 0;  // index in eps_
        ByMem<RemoteMem> remote;
        ByMem<Region> local;
        ByMem<Region> rev;  // --bidir: where the target's own transfers go to or come from
    };

    Endpoint* ep(const PeerState& p) const { return eps_[static_cast<size_t>(p.ep)].get(); }
    int gpu(const PeerState& p) const { return gpus_[static_cast<size_t>(p.ep)]; }

    Shape shape(Op op) const {
        Shape s;
        s.op = op;
        s.size = size_;
        s.batch = o_.batch;
        s.conc = conc_;
        return s;
    }

    // The raw baseline's own memory: the engine may still be finishing a transfer's last send
    // completion in its buffers (the peer has the bytes already), and its threads must never
    // share bytes with the baseline's.
    uint8_t* raw_buffer(uint64_t bytes) {
        if (raw_mem_.size() < bytes) raw_mem_.resize(bytes);
        return raw_mem_.data();
    }

    StatusOr<XferId> post(Op op, MemType type, size_t p, int slot) {
        PeerState& ps = peers_[p];
        StatusOr<XferId> id = post_lane(Lane{ep(ps), ps.id, ps.local[type].mem, ps.remote[type]},
                                        shape(op), slot, &iov_);
        if (!id.ok()) {
            return Status(id.status())
                .with_context(strformat("posting a %s to target %zu", op_name(op), p));
        }
        return id;
    }

    // --bidir --verify, the targets' direction: before, the last transfer's source (theirs for
    // WRITE, ours for READ) gets the pattern and its destination is poisoned; after, the
    // destination must hold the pattern.
    Status verify_prep_rev(Op op, MemType type, int npeers) {
        if (!o_.verify) return Status();
        rrun_ = run_ | (1ULL << 63);  // apart from the forward direction's run numbers
        const uint64_t off = static_cast<uint64_t>(conc_) * slot_bytes_;
        for (int i = 0; i < npeers; ++i) {
            TCPX_RETURN_IF_ERROR(prepare_bytes(peers_[static_cast<size_t>(i)].rev[type].buf, off,
                                               slot_bytes_, op == Op::kRead,
                                               pattern_seed(rrun_, i)));
        }
        // "prep read" patterns, "prep write" poisons: the target is the source of its WRITEs.
        return peer_
            ->call(strformat("prep %s %s %llu %llu %llu %d rev",
                             op == Op::kWrite ? "read" : "write", mem_name(type),
                             static_cast<unsigned long long>(rrun_),
                             static_cast<unsigned long long>(off),
                             static_cast<unsigned long long>(slot_bytes_), npeers))
            .status();
    }

    Status verify_check_rev(Op op, MemType type, int npeers) {
        if (!o_.verify) return Status();
        const uint64_t off = static_cast<uint64_t>(conc_) * slot_bytes_;
        const std::string what =
            strformat("the targets' %s of %s (batch %d, %s memory, --bidir), last transfer",
                      op_name(op), format_bytes(size_).c_str(), o_.batch, mem_name(type));
        if (op == Op::kRead) {
            auto reply = peer_->call(strformat(
                "check %s %llu %llu %llu %d rev", mem_name(type),
                static_cast<unsigned long long>(rrun_), static_cast<unsigned long long>(off),
                static_cast<unsigned long long>(slot_bytes_), npeers));
            if (reply.ok()) return Status();
            return internal_error("VERIFICATION FAILED: " + what + ": " +
                                  std::string(reply.status().message()));
        }
        for (int i = 0; i < npeers; ++i) {
            Status st = check_bytes(peers_[static_cast<size_t>(i)].rev[type].buf, off, slot_bytes_,
                                    pattern_seed(rrun_, i), "from target " + std::to_string(i));
            if (!st.ok() && st.code() != StatusCode::kInternal) return st;
            if (!st.ok()) {
                return internal_error("VERIFICATION FAILED: " + what + ", " +
                                      std::string(st.message()));
            }
        }
        return Status();
    }

    // --verify: before a measurement, its last transfer's source gets this measurement's
    // pattern and its destination is poisoned; after it, the destination must hold the pattern.
    Status verify_prep(Op op, MemType type, int npeers) {
        if (!o_.verify) return Status();
        ++run_;
        const uint64_t off = static_cast<uint64_t>(conc_) * slot_bytes_;
        for (int i = 0; i < npeers; ++i) {
            TCPX_RETURN_IF_ERROR(prepare_bytes(peers_[static_cast<size_t>(i)].local[type].buf, off,
                                               slot_bytes_, op == Op::kWrite,
                                               pattern_seed(run_, i)));
        }
        return peer_
            ->call(strformat("prep %s %s %llu %llu %llu %d", op == Op::kWrite ? "write" : "read",
                             mem_name(type), static_cast<unsigned long long>(run_),
                             static_cast<unsigned long long>(off),
                             static_cast<unsigned long long>(slot_bytes_), npeers))
            .status();
    }

    Status verify_check(Op op, MemType type, int npeers) {
        if (!o_.verify) return Status();
        const uint64_t off = static_cast<uint64_t>(conc_) * slot_bytes_;
        const std::string what =
            strformat("%s of %s (batch %d, %s memory), last transfer", op_name(op),
                      format_bytes(size_).c_str(), o_.batch, mem_name(type));
        if (op == Op::kWrite) {
            auto reply = peer_->call(strformat(
                "check %s %llu %llu %llu %d", mem_name(type), static_cast<unsigned long long>(run_),
                static_cast<unsigned long long>(off), static_cast<unsigned long long>(slot_bytes_),
                npeers));
            if (reply.ok()) return Status();
            // The target's message (after "peer: INTERNAL: ") says where.
            std::string why(reply.status().message());
            const size_t at = why.find("target ");
            if (at != std::string::npos) why = why.substr(at);
            return internal_error("VERIFICATION FAILED: " + what + ", in " + why);
        }
        for (int i = 0; i < npeers; ++i) {
            Status st =
                check_bytes(peers_[static_cast<size_t>(i)].local[type].buf, off, slot_bytes_,
                            pattern_seed(run_, i), "from target " + std::to_string(i));
            if (!st.ok() && st.code() != StatusCode::kInternal) return st;  // not the bytes
            if (!st.ok()) {
                return internal_error("VERIFICATION FAILED: " + what + ", " +
                                      std::string(st.message()));
            }
        }
        return Status();
    }

    const EngineBenchOptions& o_;
    Config config_;
    Peer* peer_;
    std::vector<PeerState> peers_;  // declared before eps_: outlives them
    std::vector<uint8_t> raw_mem_;  // the raw TCP baseline's buffer
    std::vector<std::unique_ptr<Endpoint>> eps_;
    std::vector<int> gpus_;  // per endpoint
    Directions last_;
    uint64_t rrun_ = 0;
    RawTcpInitiator raw_;
    std::vector<IoVec> iov_;
    ByMem<std::vector<std::vector<IoVec>>> kv_iov_;  // --kv: the requests' pieces
    uint64_t size_ = 0;
    uint64_t slot_bytes_ = 0;
    int conc_ = 1;
    int channels_ = 1;  // as they run (channels())
    uint64_t run_ = 0;
};

// --- reporting ----------------------------------------------------------------------------------

struct Row {
    Op op = Op::kWrite;
    uint64_t size = 0;
    int concurrency = 0;  // per peer, after the memory cap
    Throughput ours;      // between memory of --mem
    Throughput host;      // --mem vram: the same between host memory
    Throughput single;    // one peer, when peers > 1
    Throughput raw;
    Latency ours_lat;
    Latency host_lat;
    Latency raw_lat;
    // Of `ours`: the initiator's direction and, with --bidir, the targets' (GB/s; ours is their
    // sum); per peer (or pair), in each direction.
    double fwd = 0;
    double rev = 0;
    std::vector<double> per_peer;
    std::vector<double> per_peer_rev;
};

struct Setup {
    int raw_streams = 0;
    int io_threads = 0;  // per endpoint
    std::string target;  // with --connect: what the target said of its engine
};

// The GB/s of each direction and peer in a measurement of `iters` transfers of `bytes` per peer,
// from each peer's seconds.
void split_directions(const std::vector<double>& secs, uint64_t bytes, uint64_t iters, double* all,
                      std::vector<double>* per_peer) {
    double longest = 0;
    per_peer->clear();
    for (double v : secs) {
        longest = std::max(longest, v);
        per_peer->push_back(v > 0 ? static_cast<double>(bytes * iters) / v / 1e9 : 0);
    }
    *all = longest > 0 ? static_cast<double>(bytes * iters * secs.size()) / longest / 1e9 : 0;
}

// How the roles ran: "1 process", "2 processes", "targets at HOST:PORT".
std::string roles_text(const EngineBenchOptions& o) {
    if (!o.connect.empty()) return "targets on " + o.connect + " (side channel)";
    return o.processes == 1 ? "1 process" : "2 processes";
}

// What "peers" are: target endpoints of one initiator endpoint, or pairs of endpoints.
std::string peers_text(const EngineBenchOptions& o) {
    if (o.per_gpu)
        return strformat("%d GPU pair%s (GPU i to GPU i)", o.peers, o.peers == 1 ? "" : "s");
    if (o.pairs) return strformat("%d endpoint pair%s", o.peers, o.peers == 1 ? "" : "s");
    return strformat("%d peer%s", o.peers, o.peers == 1 ? "" : "s");
}

// With an ncclNet plugin the data sockets are the plugin's, not NSOCKS: Google's plugin opens
// NCCL_NSOCKS_PERTHREAD x NCCL_SOCKET_NTHREADS per comm.
std::string plugin_sockets_text() {
    const char* per_thread = std::getenv("NCCL_NSOCKS_PERTHREAD");
    const char* threads = std::getenv("NCCL_SOCKET_NTHREADS");
    if (per_thread != nullptr && threads != nullptr) {
        return strformat("the plugin's own: NCCL_NSOCKS_PERTHREAD x NCCL_SOCKET_NTHREADS = %s x %s",
                         per_thread, threads);
    }
    return "the plugin's own (NCCL_NSOCKS_PERTHREAD x NCCL_SOCKET_NTHREADS, not set here: the "
           "plugin's defaults)";
}

// Whether the rows carry the host figures of --mem vram.
bool host_figures(const EngineBenchOptions& o) {
    return o.mem == MemType::kVram && o.host_baseline;
}

// The size column is followed by a mark: `*` where the concurrency was cut.
std::vector<Column<Row>> table_columns(const EngineBenchOptions& o) {
    const bool multi = o.peers > 1 && o.single_peer;
    const bool host = host_figures(o);
    std::vector<Column<Row>> cols;
    cols.push_back({0, -5, "op", [](const Row& r) { return std::string(op_name(r.op)); }});
    cols.push_back({1, 9, "size", [batch = o.batch](const Row& r) {
                        std::string size = format_bytes(r.size);
                        return batch > 1 ? strformat("%dx%s", batch, size.c_str()) : size;
                    }});
    cols.push_back({0, 1, "", [conc = o.concurrency](const Row& r) {
                        return std::string(r.concurrency < conc ? "*" : " ");
                    }});
    cols.push_back({1, 8, "GB/s", [](const Row& r) { return gbps_cell(r.ours); }});
    auto number = [](double v) { return v > 0 ? strformat("%.2f", v) : std::string("-"); };
    if (o.bidir) {
        cols.push_back({1, 7, "i->t", [=](const Row& r) { return number(r.fwd); }});
        cols.push_back({1, 7, "t->i", [=](const Row& r) { return number(r.rev); }});
    }
    if (o.pairs && o.peers > 1) {
        for (int i = 0; i < o.peers; ++i) {
            const auto k = static_cast<size_t>(i);
            cols.push_back({1, 7, "#" + std::to_string(i), [=](const Row& r) {
                                double v = k < r.per_peer.size() ? r.per_peer[k] : 0;
                                if (k < r.per_peer_rev.size()) v += r.per_peer_rev[k];
                                return number(v);
                            }});
        }
    }
    if (host) {
        cols.push_back({1, 8, "host", [](const Row& r) { return gbps_cell(r.host); }});
        cols.push_back(
            {1, 9, "vram/host", [](const Row& r) { return ratio(r.ours.gbps, r.host.gbps); }});
    }
    cols.push_back({1, 8, "raw", [](const Row& r) { return gbps_cell(r.raw); }});
    cols.push_back({1, 8, "ours/raw", [bidir = o.bidir](const Row& r) {
                        return ratio(bidir ? r.fwd : r.ours.gbps, r.raw.gbps);
                    }});
    cols.push_back({2, 8, "CPU s/GB", [](const Row& r) { return cpu_cell(r.ours); }});
    if (host) cols.push_back({1, 8, "host CPU", [](const Row& r) { return cpu_cell(r.host); }});
    cols.push_back({1, 8, "raw CPU", [](const Row& r) { return cpu_cell(r.raw); }});
    cols.push_back({1, 10, "CPU vs TCP",
                    [](const Row& r) { return ratio(cpu_per_gb(r.ours), cpu_per_gb(r.raw)); }});
    if (multi) {
        cols.push_back({2, 8, o.pairs ? "1 pair" : "1 peer",
                        [](const Row& r) { return gbps_cell(r.single); }});
        cols.push_back({1, 7, strformat("%d/1", o.peers),
                        [](const Row& r) { return ratio(r.ours.gbps, r.single.gbps); }});
    }
    auto p50 = [](const Latency& l) { return usecs_cell(l.p50_us, l.iters); };
    auto p99 = [](const Latency& l) { return usecs_cell(l.p99_us, l.iters); };
    cols.push_back({2, 10, "lat p50", [=](const Row& r) { return p50(r.ours_lat); }});
    if (host) {
        cols.push_back({1, 10, "host p50", [=](const Row& r) { return p50(r.host_lat); }});
        cols.push_back({1, 9, "vram/host",
                        [](const Row& r) { return ratio(r.ours_lat.p50_us, r.host_lat.p50_us); }});
    }
    cols.push_back({1, 10, "raw p50", [=](const Row& r) { return p50(r.raw_lat); }});
    cols.push_back({1, 8, "ours/raw",
                    [](const Row& r) { return ratio(r.ours_lat.p50_us, r.raw_lat.p50_us); }});
    cols.push_back({2, 10, "lat p99", [=](const Row& r) { return p99(r.ours_lat); }});
    cols.push_back({1, 10, "raw p99", [=](const Row& r) { return p99(r.raw_lat); }});
    return cols;
}

// The engine's settings as they ran (Config::effective: automatic values resolved).
void print_engine_line(const Config& c, const Setup& s) {
    if (c.net_plugin.empty()) {
        std::printf(
            "engine: %lld channel%s x %lld data sockets = %d raw streams, chunk %s, window %lld, "
            "inline up to %s, %d I/O threads per endpoint\n",
            static_cast<long long>(c.channels), c.channels == 1 ? "" : "s",
            static_cast<long long>(c.nsocks), s.raw_streams,
            format_bytes(c.xfer_chunk_size).c_str(), static_cast<long long>(c.window),
            format_bytes(c.xfer_inline_threshold).c_str(), s.io_threads);
    } else {
        std::printf(
            "engine: %lld channel%s, chunk %s, window %lld, inline up to %s; net: ncclNet plugin "
            "%s, data sockets and their threads %s\n",
            static_cast<long long>(c.channels), c.channels == 1 ? "" : "s",
            format_bytes(c.xfer_chunk_size).c_str(), static_cast<long long>(c.window),
            format_bytes(c.xfer_inline_threshold).c_str(), c.net_plugin.c_str(),
            plugin_sockets_text().c_str());
    }
    if (!s.target.empty()) std::printf("target: %s\n", s.target.c_str());
}

// --stats: both sides' counters, after the table; with --json as one JSON line on stderr, so
// that stdout stays one document.
void print_stats(const EngineBenchOptions& o, const Stats& ours, const Stats& theirs) {
    if (o.json) {
        nlohmann::json j;
        for (size_t i = 0; i < std::size(kStatFields); ++i) {
            j["initiator"][kStatNames[i]] = ours.*kStatFields[i];
            j["target"][kStatNames[i]] = theirs.*kStatFields[i];
        }
        std::fprintf(stderr, "%s\n", nlohmann::json{{"stats", j}}.dump().c_str());
        return;
    }
    std::printf("\ncounters (Endpoint::stats, all of this run's endpoints):\n");
    std::printf("  %-20s %20s %20s\n", "", "initiator", "target");
    for (size_t i = 0; i < std::size(kStatFields); ++i) {
        std::printf("  %-20s %20llu %20llu\n", kStatNames[i],
                    static_cast<unsigned long long>(ours.*kStatFields[i]),
                    static_cast<unsigned long long>(theirs.*kStatFields[i]));
    }
}

void print_table(const EngineBenchOptions& o, const Config& c, const Setup& s,
                 const std::vector<Row>& rows) {
    const bool multi = o.peers > 1 && o.single_peer;
    std::printf(
        "tcpx-p2p bench engine: transfer engine vs raw TCP, %s, %s, %s x %d transfers in flight, "
        "batch %d%s\n",
        o.interface.c_str(), roles_text(o).c_str(), peers_text(o).c_str(), o.concurrency, o.batch,
        o.bidir ? ", both directions at once" : "");
    if (o.mem == MemType::kVram && o.per_gpu) {
        std::printf(
            "memory: GPU (cudaMalloc), pair i on GPU i of both sides%s\n",
            host_figures(o) ? "; host, vram/host: the same transfers between host memory" : "");
    } else if (o.mem == MemType::kVram) {
        std::printf(
            "memory: GPU (cudaMalloc), the initiator's on GPU %d, the targets' on GPU %d%s\n",
            o.gpus[0], o.gpus[1],
            host_figures(o) ? "; host, vram/host: the same transfers between host memory" : "");
    } else {
        std::printf("memory: host (page-aligned, pageable)\n");
    }
    print_engine_line(c, s);
    std::printf(
        "throughput: GB/s (10^9 B/s) of all %s together%s; raw: %d TCP streams, each "
        "transfer's bytes split evenly, same %sbuffers, one direction\n",
        o.pairs ? "pairs" : "peers", o.bidir ? " and both directions" : "", s.raw_streams,
        o.mem == MemType::kVram ? "host " : "");
    if (o.bidir) {
        std::printf(
            "both directions: i->t the initiator's transfers toward the targets, t->i the "
            "targets' own toward the initiator, at the same time; ours/raw: i->t over raw\n");
    }
    if (o.pairs && o.peers > 1) {
        std::printf("#i: pair i's GB/s%s\n", o.bidir ? " (both directions)" : "");
    }
    std::printf(
        "CPU s/GB: CPU seconds (user + system, every thread) of both sides, initiator and "
        "targets, per GB moved by the throughput run;\n  raw CPU: the raw TCP baseline's; CPU vs "
        "TCP: the engine's over raw TCP's\n");
    if (multi) {
        std::printf("1 peer: the same with one peer; %d/1: all %d peers over one peer\n", o.peers,
                    o.peers);
    }
    std::printf(
        "latency: one transfer from post to completion, nothing else in flight (1 peer); raw: "
        "ping-pong over 1 TCP stream,\n"
        "  WRITE vs the data there and %llu B back (data + ack), READ vs %llu B there and the "
        "data back (request + data)\n\n",
        static_cast<unsigned long long>(kSmallMessage),
        static_cast<unsigned long long>(kSmallMessage));
    const std::vector<Column<Row>> cols = table_columns(o);
    std::printf("%s\n", table_head(cols).c_str());
    bool capped = false;
    for (const Row& r : rows) {
        capped = capped || r.concurrency < o.concurrency;
        std::printf("%s\n", table_row(cols, r).c_str());
    }
    if (capped) {
        std::printf("\n* fewer transfers in flight per peer (at most %s in flight in all):",
                    format_bytes(kMaxInFlightBytes).c_str());
        uint64_t last = 0;
        for (const Row& r : rows) {
            if (r.concurrency < o.concurrency && r.size != last) {
                std::printf(" %s: %d", format_bytes(r.size).c_str(), r.concurrency);
                last = r.size;
            }
        }
        std::printf("\n");
    }
    if (o.verify) std::printf("\nverified: the last transfer of every measurement\n");
}

void print_json(const EngineBenchOptions& o, const Config& c, const Setup& s,
                const std::vector<Row>& rows) {
    using nlohmann::json;
    // transfers: in all (per peer times peers).
    auto tp = [](const Throughput& t, int npeers) {
        json j = throughput_json(t, "transfers", t.iters * static_cast<uint64_t>(npeers));
        if (npeers > 1) j["transfers_per_peer"] = t.iters;
        return j;
    };
    auto lat = latency_json;
    json out;
    out["benchmark"] = "engine";
    out["config"] = {
        {"interface", o.interface},
        {"processes", o.processes},
        {"connect", o.connect},
        {"peers", o.peers},
        {"pairs", o.pairs},
        {"per_gpu", o.per_gpu},
        {"bidir", o.bidir},
        {"concurrency", o.concurrency},
        {"batch", o.batch},
        {"net_plugin", c.net_plugin},
        {"channels", c.channels},
        {"nsocks", c.net_plugin.empty() ? json(c.nsocks) : json(plugin_sockets_text())},
        {"raw_streams", s.raw_streams},
        {"xfer_chunk_size", c.xfer_chunk_size},
        {"window", c.window},
        {"xfer_inline_threshold", c.xfer_inline_threshold},
        {"io_threads_per_endpoint", s.io_threads},
        {"target", s.target},
        {"min_seconds", o.min_seconds},
        {"min_iters", o.min_iters},
        {"verify", o.verify},
        {"mem", mem_name(o.mem)},
        {"host_baseline", host_figures(o)},
        {"latency", "one transfer, post to completion, nothing else in flight, 1 peer"},
        {"raw_latency", strformat("ping-pong on 1 TCP stream: WRITE = data there, %llu B back; "
                                  "READ = %llu B there, data back",
                                  static_cast<unsigned long long>(kSmallMessage),
                                  static_cast<unsigned long long>(kSmallMessage))}};
    if (o.mem == MemType::kVram) {
        out["config"]["gpus"] = {{"initiator", o.gpus[0]}, {"targets", o.gpus[1]}};
    }
    out["results"] = json::array();
    for (const Row& r : rows) {
        const uint64_t bytes = r.size * static_cast<uint64_t>(o.batch);
        json row = {{"op", r.op == Op::kWrite ? "write" : "read"},
                    {"size", r.size},
                    {"batch", o.batch},
                    {"bytes_per_transfer", bytes},
                    {"concurrency", r.concurrency}};
        if (r.ours.iters) row["ours"] = tp(r.ours, o.peers);
        if (r.ours.iters && (o.bidir || o.pairs)) {
            row["initiator_to_targets_gbps"] = r.fwd;
            row["per_peer_gbps"] = r.per_peer;
            if (o.bidir) {
                row["targets_to_initiator_gbps"] = r.rev;
                row["per_peer_targets_to_initiator_gbps"] = r.per_peer_rev;
            }
        }
        if (r.host.iters) {
            row["host"] = tp(r.host, o.peers);
            row["vram_host_ratio"] = r.ours.gbps / r.host.gbps;
        }
        if (r.single.iters) {
            row["single_peer"] = tp(r.single, 1);
            row["peers_ratio"] = r.ours.gbps / r.single.gbps;
        }
        if (r.raw.iters) row["raw"] = tp(r.raw, 1);
        if (r.ours.iters && r.raw.iters) row["throughput_ratio"] = r.ours.gbps / r.raw.gbps;
        if (cpu_per_gb(r.ours) > 0 && cpu_per_gb(r.raw) > 0) {
            row["cpu_vs_tcp"] = cpu_per_gb(r.ours) / cpu_per_gb(r.raw);
        }
        if (r.ours_lat.iters) row["ours_latency"] = lat(r.ours_lat);
        if (r.host_lat.iters) {
            row["host_latency"] = lat(r.host_lat);
            row["latency_p50_vram_host_ratio"] = r.ours_lat.p50_us / r.host_lat.p50_us;
            row["latency_p99_vram_host_ratio"] = r.ours_lat.p99_us / r.host_lat.p99_us;
        }
        if (r.raw_lat.iters) {
            json l = lat(r.raw_lat);
            l["request_bytes"] = r.op == Op::kWrite ? bytes : kSmallMessage;
            l["reply_bytes"] = r.op == Op::kWrite ? kSmallMessage : bytes;
            row["raw_pingpong"] = l;
        }
        if (r.ours_lat.iters && r.raw_lat.iters) {
            row["latency_p50_ratio"] = r.ours_lat.p50_us / r.raw_lat.p50_us;
            row["latency_p99_ratio"] = r.ours_lat.p99_us / r.raw_lat.p99_us;
        }
        out["results"].push_back(row);
    }
    std::printf("%s\n", out.dump(2).c_str());
}

// --- the KV workload's report (the rows' layout is bench/kv_workload's) --------------------------

void print_kv_table(const EngineBenchOptions& o, const Config& c, const Setup& s,
                    const std::vector<KvRow>& rows) {
    std::printf("tcpx-p2p bench engine --kv: a paged KV cache, %s, %s, one request at a time\n",
                o.interface.c_str(), roles_text(o).c_str());
    print_kv_shape(o.kv_shape);
    if (o.mem == MemType::kVram) {
        std::printf("memory: GPU (cudaMalloc), the initiator's on GPU %d, the target's on GPU %d\n",
                    o.gpus[0], o.gpus[1]);
    }
    // With an ncclNet plugin the data sockets and their threads are the plugin's (not NSOCKS nor
    // our I/O threads): the line says so, as the sweep's header does.
    if (c.net_plugin.empty()) {
        std::printf(
            "engine: %lld channel%s x %lld data sockets, chunk %s, window %lld, %d I/O threads per "
            "endpoint\n",
            static_cast<long long>(c.channels), plural(c.channels),
            static_cast<long long>(c.nsocks), format_bytes(c.xfer_chunk_size).c_str(),
            static_cast<long long>(c.window), s.io_threads);
    } else {
        std::printf("engine: %lld channel%s, chunk %s, window %lld\n",
                    static_cast<long long>(c.channels), plural(c.channels),
                    format_bytes(c.xfer_chunk_size).c_str(), static_cast<long long>(c.window));
        std::printf("net: ncclNet plugin %s, data sockets and their threads %s\n",
                    c.net_plugin.c_str(), plugin_sockets_text().c_str());
    }
    if (!s.target.empty()) std::printf("target: %s\n", s.target.c_str());
    print_kv_rows(rows, o.verify);
}

void print_kv_json(const EngineBenchOptions& o, const Config& c, const std::vector<KvRow>& rows) {
    using nlohmann::json;
    json out;
    out["benchmark"] = "engine-kv";
    out["config"] = {
        {"interface", o.interface},
        {"processes", o.processes},
        {"connect", o.connect},
        {"mem", mem_name(o.mem)},
        {"net_plugin", c.net_plugin},
        {"channels", c.channels},
        {"nsocks", c.net_plugin.empty() ? json(c.nsocks) : json(plugin_sockets_text())},
        {"xfer_chunk_size", c.xfer_chunk_size},
        {"window", c.window}};
    out["kv"] = kv_shape_json(o.kv_shape);
    json results = json::array();
    for (const KvRow& r : rows) results.push_back(kv_row_json(r));
    out["results"] = results;
    std::printf("%s\n", out.dump(2).c_str());
}

Status check_options(const EngineBenchOptions& o) {
    if (o.kv) {
        if (o.peers != 1) return invalid_argument("--kv: one peer (--peers 1)");
        if (o.batch != 1) return invalid_argument("--kv: a request is its own batch (no --batch)");
        TCPX_RETURN_IF_ERROR(check_kv_shape(o.kv_shape));
    }
    if (o.sizes.empty()) return invalid_argument("no sizes");
    for (uint64_t s : o.sizes) {
        if (s == 0) return invalid_argument("--sizes: a size of 0");
    }
    if (!o.write && !o.read) return invalid_argument("no operation to measure");
    if (o.processes != 1 && o.processes != 2) return invalid_argument("--procs must be 1 or 2");
    if (o.batch < 1) return invalid_argument("--batch must be at least 1");
    if (o.concurrency < 1) return invalid_argument("--concurrency must be at least 1");
    if (o.peers < 1) return invalid_argument("--peers must be at least 1");
    if (!o.listen.empty()) return invalid_argument("--listen: the target runs listen_engine_bench");
    if (!o.connect.empty() && o.processes != 2) {
        return invalid_argument("--connect: the targets are on the other host; no --procs");
    }
    if (o.kv && (o.bidir || o.pairs)) {
        return invalid_argument("--kv: one direction, one peer (no --bidir, --pairs, --gpus all)");
    }
    if (o.per_gpu && o.mem != MemType::kVram) {
        return invalid_argument("--gpus all: one endpoint pair per GPU, with --mem vram");
    }
    if (o.pairs && !o.per_gpu && o.mem == MemType::kVram) {
        return invalid_argument(
            "--pairs: host memory; for GPU memory, --gpus all (a pair per GPU)");
    }
    if (!o.gpus.empty()) {
        if (o.mem != MemType::kVram) return invalid_argument("--gpus applies to --mem vram only");
        if (o.gpus.size() != 2) return invalid_argument("--gpus takes two GPU indices: A,B");
        for (int g : o.gpus) {
            if (g < 0) return invalid_argument("--gpus: a GPU index below 0");
        }
    }
    return Status();
}

// --mem vram: fails unless GPUs can be used, refuses GPUs that do not exist, and picks the
// default pair when --gpus was not given (two GPUs when there are, so that the copies of both
// sides do not share one).
Status choose_gpus(EngineBenchOptions* o) {
    if (o->mem != MemType::kVram) return Status();
    StatusOr<int> n = usable_gpus();
    if (!n.ok()) return Status(n.status()).with_context(o->per_gpu ? "--gpus all" : "--mem vram");
    if (o->per_gpu) {
        o->peers = *n;  // pair i on GPU i of both sides
        return Status();
    }
    if (o->gpus.empty()) o->gpus = *n >= 2 ? std::vector<int>{0, 1} : std::vector<int>{0, 0};
    for (int g : o->gpus) {
        if (g >= *n) {
            return invalid_argument(strformat("--gpus %d,%d: there is no GPU %d (%d usable)",
                                              o->gpus[0], o->gpus[1], g, *n));
        }
    }
    return Status();
}

std::vector<std::string> serve_args(const EngineBenchOptions& o) {
    std::vector<std::string> args = {"bench", "engine", "--serve", "--interface", o.interface};
    auto add = [&](const char* flag, const std::string& v) {
        if (v.empty()) return;
        args.push_back(flag);
        args.push_back(v);
    };
    add("--channels", o.channels);
    add("--nsocks", o.nsocks);
    add("--chunk", o.chunk);
    add("--window", o.window);
    add("--mem", mem_name(o.mem));
    if (o.gpus.size() == 2) add("--gpus", strformat("%d,%d", o.gpus[0], o.gpus[1]));
    if (o.bidir) args.push_back("--bidir");
    return args;
}

// --- the side channel (--listen / --connect)
// ------------------------------------------------------
//
// The same command lines as the child's pipes, over one TCP connection. The initiator speaks
// first: "hello tcpx-p2p-bench-engine 1 <key>=<value>...", the target settings the target's
// command line would carry in the child (serve_args); the target answers "hello
// tcpx-p2p-bench-engine 1 <what its engine runs>", or "error ..." and closes. Plaintext and
// unauthenticated: the engine's own handshake (TCPX_P2P_AUTH_SECRET) guards the data endpoints.

constexpr const char* kHello = "hello tcpx-p2p-bench-engine 1";

std::string hello_line(const EngineBenchOptions& o) {
    std::string line = kHello;
    auto add = [&](const char* key, const std::string& v) {
        if (!v.empty()) line += strformat(" %s=%s", key, v.c_str());
    };
    add("mem", mem_name(o.mem));
    if (o.gpus.size() == 2) add("gpus", strformat("%d,%d", o.gpus[0], o.gpus[1]));
    add("channels", o.channels);
    add("nsocks", o.nsocks);
    add("chunk", o.chunk);
    add("window", o.window);
    add("bidir", o.bidir ? "1" : "0");
    add("time", strformat("%g", o.min_seconds));
    return line;
}

// The target's options from a hello line (its own --interface stays).
Status parse_hello(const std::string& line, EngineBenchOptions* o) {
    const std::string prefix = std::string(kHello);
    if (line.rfind(prefix, 0) != 0 || (line.size() > prefix.size() && line[prefix.size()] != ' ')) {
        return invalid_argument(
            "not a tcpx-p2p bench engine initiator of this version (expected \"" + prefix + "\")");
    }
    for (const std::string& w : words(line.substr(prefix.size()))) {
        const size_t eq = w.find('=');
        if (eq == std::string::npos) return invalid_argument("hello: '" + w + "' is not key=value");
        const std::string key = w.substr(0, eq);
        const std::string value = w.substr(eq + 1);
        if (key == "mem") {
            if (!parse_mem(value, &o->mem)) return invalid_argument("hello: bad mem");
        } else if (key == "gpus") {
            if (!parse_gpu_pair(value, &o->gpus)) return invalid_argument("hello: bad gpus");
        } else if (key == "channels") {
            o->channels = value;
        } else if (key == "nsocks") {
            o->nsocks = value;
        } else if (key == "chunk") {
            o->chunk = value;
        } else if (key == "window") {
            o->window = value;
        } else if (key == "bidir" && (value == "0" || value == "1")) {
            o->bidir = value == "1";
        } else if (key == "time") {
            char* end = nullptr;
            o->min_seconds = std::strtod(value.c_str(), &end);
            if (end == value.c_str() || *end != '\0' || !(o->min_seconds > 0) ||
                o->min_seconds > 600) {
                return invalid_argument("hello: bad time");
            }
        } else {
            return invalid_argument("hello: unknown '" + w.substr(0, 64) + "'");
        }
    }
    return Status();
}

// The engine's settings as a line for the other side's header.
std::string engine_summary(const Config& c) {
    const int threads =
        c.io_threads > 0
            ? static_cast<int>(c.io_threads)
            : static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1U, 16U));
    if (!c.net_plugin.empty()) {
        return strformat("%lld channel%s, ncclNet plugin %s", static_cast<long long>(c.channels),
                         c.channels == 1 ? "" : "s", c.net_plugin.c_str());
    }
    return strformat("%lld channel%s x %lld data sockets, %d I/O threads per endpoint",
                     static_cast<long long>(c.channels), c.channels == 1 ? "" : "s",
                     static_cast<long long>(c.nsocks), threads);
}

// --connect: the side channel to the targets, greeted; with no --interface, the interface that
// reaches them.
StatusOr<std::unique_ptr<Peer>> connect_targets(EngineBenchOptions* o, std::string* target) {
    TCPX_ASSIGN_OR_RETURN(auto peer, connect_to_target(o->connect, o->connect_timeout,
                                                       reply_timeout_ms(o->min_seconds)));
    if (o->interface.empty()) {
        StatusOr<std::string> name = interface_of(peer->local());
        if (!name.ok()) {
            return Status(name.status()).with_context("--connect without --interface");
        }
        o->interface = "=" + *name;
    }
    TCPX_ASSIGN_OR_RETURN(std::string said, greet_target(peer.get(), kHello, hello_line(*o),
                                                         "tcpx-p2p bench engine", o->connect));
    *target = o->connect + ": " + said;
    return std::unique_ptr<Peer>(std::move(peer));
}

// --- the sweep ---------------------------------------------------------------------------------

std::vector<Op> ops_of(const EngineBenchOptions& o) {
    std::vector<Op> ops;
    if (o.write) ops.push_back(Op::kWrite);
    if (o.read) ops.push_back(Op::kRead);
    return ops;
}

Calibration calibration_of(const EngineBenchOptions& o) {
    Calibration cal;
    cal.min_seconds = o.min_seconds;
    cal.min_iters = static_cast<uint64_t>(o.min_iters);
    return cal;
}

// --kv: every memory and op, the KV requests and the contiguous transfer of the same bytes.
StatusOr<std::vector<KvRow>> sweep_kv(const EngineBenchOptions& o, EngineInitiator* init) {
    TCPX_RETURN_IF_ERROR(init->prepare_kv().with_context("--kv: the pools"));
    const std::vector<Op> ops = ops_of(o);
    std::vector<MemType> mems = {o.mem};
    if (host_figures(o)) mems.push_back(MemType::kHost);
    Progress progress(o.progress && !o.json, mems.size() * ops.size() * 2);
    Sweep sweep(calibration_of(o), &progress, [init] { return init->cpu_seconds(); });
    const uint64_t bytes = o.kv_shape.request_bytes();
    std::vector<KvRow> rows;
    for (MemType mem : mems) {
        for (Op op : ops) {
            KvRow row;
            row.op = op_name(op);
            row.mem = mem_name(mem);
            for (bool contiguous : {false, true}) {
                const std::string what = strformat("%s, %s memory, %s", op_name(op), mem_name(mem),
                                                   contiguous ? "contiguous" : "KV requests");
                Throughput& out = contiguous ? row.contiguous : row.kv;
                TCPX_ASSIGN_OR_RETURN(out, sweep.throughput(what, bytes, [&](uint64_t n) {
                    return init->kv_transfers(op, mem, contiguous, n);
                }));
                TCPX_RETURN_IF_ERROR(init->verify_kv(op, mem, contiguous));
            }
            row.verified = o.verify;
            rows.push_back(row);
        }
    }
    progress.clear();
    return rows;
}

// Every size and op: the engine's throughput (the host figures, one peer, raw TCP beside it)
// and its latency (host, raw ping-pong beside it), as the options ask.
StatusOr<std::vector<Row>> sweep_sizes(const EngineBenchOptions& o, EngineInitiator* init) {
    const std::vector<Op> ops = ops_of(o);
    const bool single = o.peers > 1 && o.single_peer;
    const bool host = host_figures(o);
    const size_t per_op = 1 + (host ? 1 : 0) + (single ? 1 : 0) + (o.baseline ? 1 : 0) +
                          (o.latency ? 1 + (host ? 1 : 0) + (o.baseline ? 1 : 0) : 0);
    Progress progress(o.progress && !o.json, o.sizes.size() * ops.size() * per_op);
    Sweep sweep(calibration_of(o), &progress, [init] { return init->cpu_seconds(); });
    const std::string ours_what = strformat("engine (%s)", mem_name(o.mem));
    std::vector<Row> rows;
    for (uint64_t size : o.sizes) {
        TCPX_RETURN_IF_ERROR(init->prepare(size).with_context(format_bytes(size)));
        // At least one transfer per slot in flight.
        const uint64_t min_iters = std::max<uint64_t>(static_cast<uint64_t>(o.min_iters),
                                                      static_cast<uint64_t>(init->concurrency()));
        const uint64_t bytes = init->slot_bytes();
        // --bidir: the same again in the other direction.
        const uint64_t dirs = o.bidir ? 2 : 1;
        const uint64_t all_bytes = bytes * static_cast<uint64_t>(o.peers) * dirs;
        auto throughput = [&](const std::string& what, uint64_t n_bytes, Throughput* out,
                              const TimedRun& fn) -> Status {
            TCPX_ASSIGN_OR_RETURN(*out, sweep.throughput(what, n_bytes, fn, min_iters));
            return Status();
        };
        auto latency = [&](const std::string& what, Latency* out, const SampledRun& fn) -> Status {
            TCPX_ASSIGN_OR_RETURN(*out, sweep.latency(what, fn));
            return Status();
        };
        for (Op op : ops) {
            Row row;
            row.op = op;
            row.size = size;
            row.concurrency = init->concurrency();
            const std::string what = std::string(op_name(op)) + " " + format_bytes(size);
            TCPX_RETURN_IF_ERROR(
                throughput(what + ": " + ours_what + ", throughput", all_bytes, &row.ours,
                           [&](uint64_t n) { return init->transfers(op, o.mem, o.peers, n); }));
            split_directions(init->last().fwd, bytes, row.ours.iters, &row.fwd, &row.per_peer);
            split_directions(init->last().rev, bytes, row.ours.iters, &row.rev, &row.per_peer_rev);
            if (host) {
                TCPX_RETURN_IF_ERROR(throughput(
                    what + ": engine (host), throughput", all_bytes, &row.host,
                    [&](uint64_t n) { return init->transfers(op, MemType::kHost, o.peers, n); }));
            }
            if (single) {
                TCPX_RETURN_IF_ERROR(throughput(
                    what + ": " + ours_what + ", one peer, throughput", bytes * dirs, &row.single,
                    [&](uint64_t n) { return init->transfers(op, o.mem, 1, n); }));
            }
            if (o.baseline) {
                TCPX_RETURN_IF_ERROR(
                    throughput(what + ": raw TCP, throughput", bytes, &row.raw,
                               [&](uint64_t n) { return init->raw_stream(op, n); }));
            }
            if (o.latency) {
                TCPX_RETURN_IF_ERROR(
                    latency(what + ": " + ours_what + ", one at a time", &row.ours_lat,
                            [&](uint64_t n) { return init->single_transfers(op, o.mem, n); }));
                if (host) {
                    TCPX_RETURN_IF_ERROR(latency(
                        what + ": engine (host), one at a time", &row.host_lat,
                        [&](uint64_t n) { return init->single_transfers(op, MemType::kHost, n); }));
                }
                if (o.baseline) {
                    TCPX_RETURN_IF_ERROR(
                        latency(what + ": raw TCP, ping-pong", &row.raw_lat,
                                [&](uint64_t n) { return init->raw_pingpong(op, n); }));
                }
            }
            rows.push_back(row);
        }
    }
    progress.clear();
    return rows;
}

// --stats: both sides' counters. A served read is counted when its last send completes, a
// moment after the reader has its bytes (docs/engine.md): wait (briefly) until each side has
// served what the other completed.
StatusOr<std::pair<Stats, Stats>> settled_stats(EngineInitiator* init) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (true) {
        TCPX_ASSIGN_OR_RETURN(Stats theirs, init->target_stats());
        const Stats ours = init->own_stats();
        const bool settled = theirs.requests_served >= ours.transfers_completed &&
                             ours.requests_served >= theirs.transfers_completed;
        if (settled || std::chrono::steady_clock::now() > deadline) return std::pair(ours, theirs);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

Status run(const EngineBenchOptions& options) {
    EngineBenchOptions o = options;
    // --kv: the contiguous transfer of the same bytes is the baseline.
    if (o.kv) o.baseline = false;
    TCPX_RETURN_IF_ERROR(check_options(o));
    TCPX_RETURN_IF_ERROR(choose_gpus(&o));
    Setup setup;
    std::unique_ptr<Peer> peer;
    if (!o.connect.empty()) {
        TCPX_ASSIGN_OR_RETURN(peer, connect_targets(&o, &setup.target));
    }
    TCPX_ASSIGN_OR_RETURN(Config config, bench_config(o, kInitiatorSide));
    // The emulated TCPX plugin without a wire (tests/fakes) connects comms inside one process
    // only: with targets in a child every transfer would stall until the timeout.
    const char* no_wire = std::getenv("FAKETCPX_NO_WIRE");
    if (o.processes == 2 && !config.net_plugin.empty() && no_wire != nullptr &&
        std::string(no_wire) == "1") {
        return invalid_argument(
            "FAKETCPX_NO_WIRE=1: the emulated plugin without a wire needs both ends in one "
            "process; use --procs 1");
    }
    if (peer) {
        // connected already (--connect)
    } else if (o.processes == 2) {
        TCPX_ASSIGN_OR_RETURN(peer, ProcessPeer::spawn(serve_args(o)));
    } else {
        TCPX_ASSIGN_OR_RETURN(Config target_config, bench_config(o, kTargetSide));
        peer = std::make_unique<ThreadPeer>([target_config, &o](Channel* ch) {
            Target target(target_config, o.interface, o.bidir);
            (void)target.serve(ch);
        });
    }
    setup.io_threads = static_cast<int>(config.io_threads);
    if (setup.io_threads == 0) {
        setup.io_threads =
            static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1U, 16U));
    }
    std::vector<Row> rows;
    std::vector<KvRow> kv_rows;
    std::optional<std::pair<Stats, Stats>> counters;  // --stats: ours, the targets'
    {
        EngineInitiator init(o, config, peer.get());
        TCPX_RETURN_IF_ERROR(init.setup().with_context("setting up"));
        // The header says what ran: the channels both sides use, the raw streams matching them.
        config.channels = init.channels();
        setup.raw_streams = init.raw_streams();
        if (o.kv) {
            TCPX_ASSIGN_OR_RETURN(kv_rows, sweep_kv(o, &init));
        } else {
            TCPX_ASSIGN_OR_RETURN(rows, sweep_sizes(o, &init));
        }
        if (o.stats) {
            TCPX_ASSIGN_OR_RETURN(counters, settled_stats(&init));
        }
    }

    if (o.kv) {
        if (o.json) {
            print_kv_json(o, config, kv_rows);
        } else {
            print_kv_table(o, config, setup, kv_rows);
        }
    } else if (o.json) {
        print_json(o, config, setup, rows);
    } else {
        print_table(o, config, setup, rows);
    }
    if (counters) print_stats(o, counters->first, counters->second);
    return Status();
}

}  // namespace

int run_engine_bench(const EngineBenchOptions& options) {
    ::signal(SIGPIPE, SIG_IGN);
    Status st = run(options);
    if (!st.ok()) {
        std::fprintf(stderr, "tcpx-p2p bench engine: %s\n", st.to_string().c_str());
        return 1;
    }
    return 0;
}

int serve_engine_bench(const EngineBenchOptions& options) {
    ::signal(SIGPIPE, SIG_IGN);
    FdChannel channel(STDIN_FILENO, STDOUT_FILENO);
    auto config = bench_config(options, kTargetSide);
    if (!config.ok()) {
        // Every command fails with the reason; the initiator reports it.
        refuse_commands(&channel, config.status());
        return 1;
    }
    Target target(*config, options.interface, options.bidir);
    Status st = target.serve(&channel);
    return st.ok() ? 0 : 1;
}

namespace {

// --listen: waits for an initiator that greets us correctly (a stray connection that does not is
// answered "error ..." and closed) and serves it. OK when it said quit.
Status listen_and_serve(const EngineBenchOptions& options) {
    if (!options.connect.empty()) return invalid_argument("--listen and --connect: pick one role");
    if (options.processes != 2) {
        return invalid_argument("--listen: the target side of two hosts; no --procs");
    }
    EngineBenchOptions o = options;
    TCPX_ASSIGN_OR_RETURN(Fd listener,
                          listen_side_channel("tcpx-p2p bench engine", options.listen));
    TCPX_ASSIGN_OR_RETURN(SideChannel side, accept_initiator("tcpx-p2p bench engine", listener,
                                                             [&](const std::string& line) {
                                                                 o = options;
                                                                 return parse_hello(line, &o);
                                                             }));
    FdChannel& ch = *side.channel;
    Status st;
    if (o.interface.empty()) {
        TCPX_ASSIGN_OR_RETURN(SocketAddress local, local_address(side.fd.get()));
        StatusOr<std::string> name = interface_of(local);
        if (!name.ok()) {
            st = Status(name.status()).with_context("--listen without --interface");
            ch.write_line("error " + st.to_string());
            return st;
        }
        o.interface = "=" + *name;
    }
    StatusOr<Config> config = bench_config(o, kTargetSide);
    if (!config.ok()) {
        st = Status(config.status()).with_context("target");
        ch.write_line("error " + st.to_string());
        return st;
    }
    std::fprintf(stderr, "tcpx-p2p bench engine: serving %s on %s\n", side.who.c_str(),
                 o.interface.c_str());
    if (!ch.write_line(std::string(kHello) + " " + o.interface + ", " + engine_summary(*config))) {
        return unavailable("initiator " + side.who + " went away");
    }
    ch.set_timeout(reply_timeout_ms(o.min_seconds));
    Target target(*config, o.interface, o.bidir);
    return target.serve(&ch).with_context("initiator " + side.who);
}

}  // namespace

int listen_engine_bench(const EngineBenchOptions& options) {
    ::signal(SIGPIPE, SIG_IGN);
    Status st = listen_and_serve(options);
    if (!st.ok()) {
        std::fprintf(stderr, "tcpx-p2p bench engine: %s\n", st.to_string().c_str());
        return 1;
    }
    std::fprintf(stderr, "tcpx-p2p bench engine: the initiator is done\n");
    return 0;
}

}  // namespace tcpx::bench
