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
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>
#include <vector>

#include "bench/bench_common.h"
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

// --- the target side (the responder) ------------------------------------------------------------

// Commands (one line each, replies "ok" unless said otherwise):
//   endpoints <n>                  creates n endpoints -> "md <hex metadata>..."
//   accept <ms>                    waits until every endpoint has its peer (accept())
//   mem <type> <bytes>             a registered region of at least `bytes` of memory `type`
//                                  (host|vram) per endpoint -> "mem <hex descriptor>..."
//   prep write|read <type> <run> <off> <len> <n>   before a verified measurement: poisons
//                                  (write) or patterns (read) [off, off + len) of the first n
//                                  regions of that type
//   check <type> <run> <off> <len> <n>   after one: checks the pattern there (the data of writes)
//   kvshape <layers> <tokens> <heads> <dim> <dtype> <pool> <blocks>   the KV workload's shape
//   cpu                            -> "cpu <seconds>": this process's CPU time so far
//   kvfill|kvcheck <type> <run> <request>   --verify of a KV request: patterns, or checks, the
//                                  pieces of request <request> in the first endpoint's region
//   raw-*                          the raw TCP baseline, in the first host region's memory
//   quit                           -> "bye"
// GPU memory is allocated on the GPU the endpoints serve (Config::gpu_index).
class Target {
 public:
    Target(Config config, const std::string& interface)
        : config_(std::move(config)), raw_(interface) {}
    ~Target() { close(); }

    Status serve(Channel* ch) {
        const RawTcpResponder::BufferFn raw_buffer = [this](uint64_t bytes) -> StatusOr<uint8_t*> {
            if (regions_.empty() || regions_[0][MemType::kHost].buf.size() < bytes) {
                return failed_precondition("raw TCP baseline: no host region of that size");
            }
            return regions_[0][MemType::kHost].buf.data();
        };
        std::string line;
        while (ch->read_line(&line)) {
            const auto w = words(line);
            if (w.empty()) continue;
            Status st;
            std::string reply = "ok";
            MemType type = MemType::kHost;
            if (w[0] == "quit") {
                close();
                ch->write_line("bye");
                return Status();
            } else if (w[0] == "endpoints" && w.size() == 2) {
                st = endpoints(std::stoi(w[1]), &reply);
            } else if (w[0] == "accept" && w.size() == 2) {
                st = accept(std::stoll(w[1]));
            } else if (w[0] == "mem" && w.size() == 3 && parse_mem(w[1], &type)) {
                st = mem(type, std::stoull(w[2]), &reply);
            } else if (w[0] == "prep" && w.size() == 7 && (w[1] == "write" || w[1] == "read") &&
                       parse_mem(w[2], &type)) {
                st = prep(w[1] == "write", type, std::stoull(w[3]), std::stoull(w[4]),
                          std::stoull(w[5]), std::stoi(w[6]));
            } else if (w[0] == "check" && w.size() == 6 && parse_mem(w[1], &type)) {
                st = check(type, std::stoull(w[2]), std::stoull(w[3]), std::stoull(w[4]),
                           std::stoi(w[5]));
            } else if (w[0] == "cpu" && w.size() == 1) {
                reply = strformat("cpu %.9f", process_cpu_seconds());
            } else if (w[0] == "kvshape" && w.size() == 8) {
                st = kv_shape(w);
            } else if ((w[0] == "kvfill" || w[0] == "kvcheck") && w.size() == 4 &&
                       parse_mem(w[1], &type)) {
                st = kv_pieces(w[0] == "kvfill", type, std::stoull(w[2]), std::stoi(w[3]));
            } else if (!raw_.handle(w, raw_buffer, &st, &reply)) {
                st = invalid_argument("unknown command: " + line);
            }
            if (!st.ok()) reply = "error " + st.to_string();
            if (!ch->write_line(reply)) break;
        }
        close();
        return unavailable("benchmark initiator went away");
    }

 private:
    Status endpoints(int n, std::string* reply) {
        if (!eps_.empty()) return failed_precondition("endpoints exist already");
        if (n < 1) return invalid_argument("endpoints: n < 1");
        *reply = "md";
        for (int i = 0; i < n; ++i) {
            TCPX_ASSIGN_OR_RETURN(auto ep,
                                  Endpoint::create(config_, "bench-target-" + std::to_string(i)));
            *reply += " " + hex_blob(ep->metadata());
            eps_.push_back(std::move(ep));
        }
        regions_.resize(static_cast<size_t>(n));
        return Status();
    }

    // One-sided transfers need no accept(); the benchmark uses it to know that both ends of every
    // connection are established before it measures (see setup()).
    Status accept(int64_t timeout_ms) {
        for (size_t i = 0; i < eps_.size(); ++i) {
            auto peer = eps_[i]->accept(std::chrono::milliseconds(timeout_ms));
            if (!peer.ok()) {
                return Status(peer.status())
                    .with_context("target " + std::to_string(i) + ": accept");
            }
        }
        return Status();
    }

    Status mem(MemType type, uint64_t bytes, std::string* reply) {
        if (eps_.empty()) return failed_precondition("mem before endpoints");
        *reply = "mem";
        for (size_t i = 0; i < eps_.size(); ++i) {
            Region& r = regions_[i][type];
            TCPX_RETURN_IF_ERROR(
                ensure_region(eps_[i].get(), &r, type, static_cast<int>(config_.gpu_index), bytes)
                    .with_context("target " + std::to_string(i)));
            TCPX_ASSIGN_OR_RETURN(RemoteMem d, eps_[i]->describe(r.mem));
            *reply += " " + hex_blob(d.serialize());
        }
        return Status();
    }

    Status in_range(int n) const {
        if (n < 1 || static_cast<size_t>(n) > regions_.size()) {
            return invalid_argument("no such region");
        }
        return Status();
    }

    Status prep(bool write, MemType type, uint64_t run, uint64_t off, uint64_t len, int n) {
        TCPX_RETURN_IF_ERROR(in_range(n));
        for (int i = 0; i < n; ++i) {
            TCPX_RETURN_IF_ERROR(prepare_bytes(regions_[static_cast<size_t>(i)][type].buf, off, len,
                                               !write, pattern_seed(run, i)));
        }
        return Status();
    }

    Status check(MemType type, uint64_t run, uint64_t off, uint64_t len, int n) {
        TCPX_RETURN_IF_ERROR(in_range(n));
        for (int i = 0; i < n; ++i) {
            TCPX_RETURN_IF_ERROR(check_bytes(regions_[static_cast<size_t>(i)][type].buf, off, len,
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
    }

    Config config_;
    KvShape kv_;
    std::vector<ByMem<Region>> regions_;  // declared before eps_: outlives them
    std::vector<std::unique_ptr<Endpoint>> eps_;
    RawTcpResponder raw_;
};

// --- the initiator's measurements ---------------------------------------------------------------

class EngineInitiator {
 public:
    EngineInitiator(const EngineBenchOptions& o, const Config& config, Peer* peer)
        : o_(o), config_(config), peer_(peer) {}
    ~EngineInitiator() {
        raw_.close();
        ep_.reset();  // before the memory it may still touch
    }

    int raw_streams() const {
        return static_cast<int>(config_.nsocks) * static_cast<int>(config_.channels);
    }

    // Both sides' CPU seconds so far: the targets are threads of this process (--procs 1) or
    // another process, which reports its own.
    StatusOr<CpuTimes> cpu_seconds() {
        CpuTimes t;
        t.here = process_cpu_seconds();
        if (o_.processes == 1) return t;
        TCPX_ASSIGN_OR_RETURN(t.peer, peer_cpu_seconds(peer_));
        return t;
    }

    Status setup() {
        TCPX_ASSIGN_OR_RETURN(ep_, Endpoint::create(config_, "bench-initiator"));
        TCPX_ASSIGN_OR_RETURN(std::string reply,
                              peer_->call("endpoints " + std::to_string(o_.peers)));
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
            auto id = ep_->connect(md);
            if (!id.ok()) {
                return Status(id.status())
                    .with_context("connecting to target " + std::to_string(i));
            }
            peers_[static_cast<size_t>(i)].id = *id;
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
        if (region * static_cast<uint64_t>(o_.peers) > (16ULL << 30)) {
            return invalid_argument(strformat("%s per side is too much memory",
                                              format_bytes(region * o_.peers).c_str()));
        }
        const int gpu = static_cast<int>(config_.gpu_index);
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
                TCPX_RETURN_IF_ERROR(ensure_region(ep_.get(), &p.local[type], type, gpu, region)
                                         .with_context("initiator"));
            }
        }
        return Status();
    }

    int concurrency() const { return conc_; }
    uint64_t slot_bytes() const { return slot_bytes_; }

    // `count` transfers between memory of `type` to each of the first `npeers` peers, conc_ in
    // flight per peer; the time until the last one completes.
    StatusOr<double> transfers(Op op, MemType type, int npeers, uint64_t count) {
        TCPX_RETURN_IF_ERROR(verify_prep(op, type, npeers));
        struct Flight {
            XferId id;
            int slot;
        };
        const int extra = conc_;
        std::vector<std::vector<Flight>> inflight(static_cast<size_t>(npeers));
        std::vector<std::vector<int>> free_slots(static_cast<size_t>(npeers));
        for (auto& f : free_slots) {
            for (int s = conc_ - 1; s >= 0; --s) f.push_back(s);
        }
        std::vector<uint64_t> posted(static_cast<size_t>(npeers), 0);
        uint64_t remaining = count * static_cast<uint64_t>(npeers);
        const auto start = Clock::now();
        auto last_done = start;
        for (uint64_t spins = 0; remaining > 0;) {
            bool progressed = false;
            for (size_t p = 0; p < inflight.size(); ++p) {
                auto& f = inflight[p];
                for (size_t i = 0; i < f.size();) {
                    XferStatus st = ep_->poll(f[i].id);
                    if (st.state == XferState::kInProgress) {
                        ++i;
                        continue;
                    }
                    if (st.state == XferState::kFailed) {
                        return st.error.with_context(
                            strformat("%s of %s to target %zu", op_name(op),
                                      format_bytes(slot_bytes_).c_str(), p));
                    }
                    if (f[i].slot != extra) free_slots[p].push_back(f[i].slot);
                    f[i] = f.back();
                    f.pop_back();
                    --remaining;
                    progressed = true;
                }
                while (posted[p] < count && f.size() < static_cast<size_t>(conc_)) {
                    int slot = extra;
                    if (posted[p] + 1 < count) {
                        slot = free_slots[p].back();
                        free_slots[p].pop_back();
                    }
                    TCPX_ASSIGN_OR_RETURN(XferId id, post(op, type, p, slot));
                    f.push_back(Flight{id, slot});
                    ++posted[p];
                    progressed = true;
                }
            }
            if (progressed) {
                spins = 0;
                last_done = Clock::now();
                continue;
            }
            // Spin first (a completion is usually microseconds away), then yield the core so the
            // engine's threads can run on a machine with few cores.
            if (++spins > 200) std::this_thread::yield();
            if (spins % 1024 == 0 && Clock::now() - last_done > kStallTimeout) {
                return timeout_error(strformat(
                    "%s of %s: no transfer completed for %lld s (%llu of %llu left)", op_name(op),
                    format_bytes(slot_bytes_).c_str(),
                    static_cast<long long>(kStallTimeout.count()),
                    static_cast<unsigned long long>(remaining),
                    static_cast<unsigned long long>(count * static_cast<uint64_t>(npeers))));
            }
        }
        const double seconds = seconds_since(start);
        TCPX_RETURN_IF_ERROR(verify_check(op, type, npeers));
        return seconds;
    }

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
            Status st = ep_->wait(id, kStallTimeout);
            if (!st.ok()) {
                return st.with_context(strformat("%s of %s, one at a time", op_name(op),
                                                 format_bytes(slot_bytes_).c_str()));
            }
            us.push_back(seconds_since(start) * 1e6);
        }
        TCPX_RETURN_IF_ERROR(verify_check(op, type, 1));
        return us;
    }

    // Raw TCP moving the same bytes in the same direction, from / into the same host buffers as
    // the first peer's transfers between host memory.
    StatusOr<double> raw_stream(Op op, uint64_t count) {
        const uint64_t slots = static_cast<uint64_t>(conc_);
        return raw_.stream(peer_, op == Op::kWrite, slot_bytes_, count, raw_buffer(), slots, slots);
    }

    // The raw request/response closest to one transfer: WRITE = the data there and an
    // acknowledgement back; READ = a request there and the data back.
    StatusOr<std::vector<double>> raw_pingpong(Op op, uint64_t count) {
        const uint64_t out = op == Op::kWrite ? slot_bytes_ : kSmallMessage;
        const uint64_t back = op == Op::kWrite ? kSmallMessage : slot_bytes_;
        return raw_.pingpong(peer_, out, back, count, raw_buffer());
    }

    // --kv: the pools of every memory type here and there (the first peer's), and the requests.
    Status prepare_kv() {
        const KvShape& k = o_.kv_shape;
        TCPX_RETURN_IF_ERROR(peer_->call("kvshape " + kv_shape_words(k)).status());
        const int gpu = static_cast<int>(config_.gpu_index);
        PeerState& p = peers_[0];
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
            TCPX_RETURN_IF_ERROR(ensure_region(ep_.get(), &p.local[type], type, gpu, k.pool)
                                     .with_context("initiator"));
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
            Status st = ep_->wait(id, kStallTimeout);
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
        TCPX_RETURN_IF_ERROR(ep_->wait(id, kStallTimeout).with_context(what));
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
        StatusOr<XferId> id = Status(StatusCode::kInternal, "not posted");
        if (contiguous) {
            const uint64_t total = o_.kv_shape.request_bytes();
            id = op == Op::kWrite
                     ? ep_->write(ps.id, ps.local[type].mem, 0, ps.remote[type], 0, total)
                     : ep_->read(ps.id, ps.local[type].mem, 0, ps.remote[type], 0, total);
        } else {
            const auto& iov = kv_iov_[type][static_cast<size_t>(request)];
            id = op == Op::kWrite ? ep_->writev(ps.id, iov) : ep_->readv(ps.id, iov);
        }
        if (!id.ok()) return Status(id.status()).with_context(kv_what(op, type, contiguous));
        return id;
    }

    struct PeerState {
        PeerId id = 0;
        ByMem<RemoteMem> remote;
        ByMem<Region> local;
    };

    uint8_t* raw_buffer() const { return peers_[0].local[MemType::kHost].buf.data(); }

    StatusOr<XferId> post(Op op, MemType type, size_t p, int slot) {
        PeerState& ps = peers_[p];
        const MemId mem = ps.local[type].mem;
        const RemoteMem& remote = ps.remote[type];
        const uint64_t base = static_cast<uint64_t>(slot) * slot_bytes_;
        StatusOr<XferId> id = Status(StatusCode::kInternal, "not posted");
        if (o_.batch == 1) {
            id = op == Op::kWrite ? ep_->write(ps.id, mem, base, remote, base, size_)
                                  : ep_->read(ps.id, mem, base, remote, base, size_);
        } else {
            iov_.resize(static_cast<size_t>(o_.batch));
            for (size_t i = 0; i < iov_.size(); ++i) {
                const uint64_t off = base + i * size_;
                iov_[i] = IoVec{mem, off, remote, off, size_};
            }
            id = op == Op::kWrite ? ep_->writev(ps.id, iov_) : ep_->readv(ps.id, iov_);
        }
        if (!id.ok()) {
            return Status(id.status())
                .with_context(strformat("posting a %s to target %zu", op_name(op), p));
        }
        return id;
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
    std::vector<PeerState> peers_;  // declared before ep_: outlives it
    std::unique_ptr<Endpoint> ep_;
    RawTcpInitiator raw_;
    std::vector<IoVec> iov_;
    ByMem<std::vector<std::vector<IoVec>>> kv_iov_;  // --kv: the requests' pieces
    uint64_t size_ = 0;
    uint64_t slot_bytes_ = 0;
    int conc_ = 1;
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
};

struct Setup {
    int raw_streams = 0;
    int io_threads = 0;  // per endpoint
};

// Whether the rows carry the host figures of --mem vram.
bool host_figures(const EngineBenchOptions& o) {
    return o.mem == MemType::kVram && o.host_baseline;
}

std::string gbps(const Throughput& t) {
    return t.iters ? strformat("%.2f", t.gbps) : std::string("-");
}

std::string usecs(double v, uint64_t iters) {
    return iters ? strformat("%.1f us", v) : std::string("-");
}

// A column of the table: `gap` spaces, then `width` characters right-aligned.
struct Column {
    int gap;
    int width;
    std::string head;
    std::function<std::string(const Row&)> cell;
};

std::vector<Column> table_columns(const EngineBenchOptions& o) {
    const bool multi = o.peers > 1 && o.single_peer;
    const bool host = host_figures(o);
    std::vector<Column> cols;
    cols.push_back({1, 8, "GB/s", [](const Row& r) { return gbps(r.ours); }});
    if (host) {
        cols.push_back({1, 8, "host", [](const Row& r) { return gbps(r.host); }});
        cols.push_back(
            {1, 9, "vram/host", [](const Row& r) { return ratio(r.ours.gbps, r.host.gbps); }});
    }
    cols.push_back({1, 8, "raw", [](const Row& r) { return gbps(r.raw); }});
    cols.push_back({1, 8, "ours/raw", [](const Row& r) { return ratio(r.ours.gbps, r.raw.gbps); }});
    cols.push_back({2, 8, "CPU s/GB", [](const Row& r) { return cpu_cell(r.ours); }});
    if (host) cols.push_back({1, 8, "host CPU", [](const Row& r) { return cpu_cell(r.host); }});
    cols.push_back({1, 8, "raw CPU", [](const Row& r) { return cpu_cell(r.raw); }});
    cols.push_back({1, 10, "CPU vs TCP",
                    [](const Row& r) { return ratio(cpu_per_gb(r.ours), cpu_per_gb(r.raw)); }});
    if (multi) {
        cols.push_back({2, 8, "1 peer", [](const Row& r) { return gbps(r.single); }});
        cols.push_back({1, 7, strformat("%d/1", o.peers),
                        [](const Row& r) { return ratio(r.ours.gbps, r.single.gbps); }});
    }
    auto p50 = [](const Latency& l) { return usecs(l.p50_us, l.iters); };
    auto p99 = [](const Latency& l) { return usecs(l.p99_us, l.iters); };
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

void print_table(const EngineBenchOptions& o, const Config& c, const Setup& s,
                 const std::vector<Row>& rows) {
    const bool multi = o.peers > 1 && o.single_peer;
    std::printf(
        "tcpx-p2p bench engine: transfer engine vs raw TCP, %s, %d process%s, %d peer%s x %d "
        "transfers in flight, batch %d\n",
        o.interface.c_str(), o.processes, o.processes == 1 ? "" : "es", o.peers,
        o.peers == 1 ? "" : "s", o.concurrency, o.batch);
    if (o.mem == MemType::kVram) {
        std::printf(
            "memory: GPU (cudaMalloc), the initiator's on GPU %d, the targets' on GPU %d%s\n",
            o.gpus[0], o.gpus[1],
            host_figures(o) ? "; host, vram/host: the same transfers between host memory" : "");
    } else {
        std::printf("memory: host (page-aligned, pageable)\n");
    }
    std::printf(
        "engine: %lld channel%s x %lld data sockets = %d raw streams, chunk %s, window %lld, "
        "inline up to %s, %d I/O threads per endpoint\n",
        static_cast<long long>(c.channels), c.channels == 1 ? "" : "s",
        static_cast<long long>(c.nsocks), s.raw_streams, format_bytes(c.xfer_chunk_size).c_str(),
        static_cast<long long>(c.window), format_bytes(c.xfer_inline_threshold).c_str(),
        s.io_threads);
    if (!c.net_plugin.empty()) std::printf("net: ncclNet plugin %s\n", c.net_plugin.c_str());
    std::printf(
        "throughput: GB/s (10^9 B/s) of all peers together; raw: %d TCP streams, each "
        "transfer's bytes split evenly, same %sbuffers\n",
        s.raw_streams, o.mem == MemType::kVram ? "host " : "");
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
    // The size column is followed by a mark: `*` where the concurrency was cut.
    const std::vector<Column> cols = table_columns(o);
    std::printf("%-5s %9s ", "op", "size");
    for (const Column& col : cols) std::printf("%*s%*s", col.gap, "", col.width, col.head.c_str());
    std::printf("\n");
    bool capped = false;
    for (const Row& r : rows) {
        const bool cap = r.concurrency < o.concurrency;
        capped = capped || cap;
        std::string size = format_bytes(r.size);
        if (o.batch > 1) size = strformat("%dx%s", o.batch, size.c_str());
        std::printf("%-5s %9s%s", op_name(r.op), size.c_str(), cap ? "*" : " ");
        for (const Column& col : cols) {
            std::printf("%*s%*s", col.gap, "", col.width, col.cell(r).c_str());
        }
        std::printf("\n");
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
        json j = {{"gbps", t.gbps},
                  {"transfers", t.iters * static_cast<uint64_t>(npeers)},
                  {"seconds", t.seconds},
                  {"cpu_seconds", t.cpu_seconds},
                  {"cpu_seconds_target_process", t.peer_cpu_seconds},
                  {"cpu_s_per_gb", cpu_per_gb(t)}};
        if (npeers > 1) j["transfers_per_peer"] = t.iters;
        return j;
    };
    auto lat = [](const Latency& l) {
        return json{
            {"p50_us", l.p50_us}, {"p99_us", l.p99_us}, {"mean_us", l.mean_us}, {"iters", l.iters}};
    };
    json out;
    out["benchmark"] = "engine";
    out["config"] = {
        {"interface", o.interface},
        {"processes", o.processes},
        {"peers", o.peers},
        {"concurrency", o.concurrency},
        {"batch", o.batch},
        {"net_plugin", c.net_plugin},
        {"channels", c.channels},
        {"nsocks", c.nsocks},
        {"raw_streams", s.raw_streams},
        {"xfer_chunk_size", c.xfer_chunk_size},
        {"window", c.window},
        {"xfer_inline_threshold", c.xfer_inline_threshold},
        {"io_threads_per_endpoint", s.io_threads},
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

// --- the sweep ---------------------------------------------------------------------------------

// --- the KV workload's report (the rows' layout is bench/kv_workload's) --------------------------

void print_kv_table(const EngineBenchOptions& o, const Config& c, const Setup& s,
                    const std::vector<KvRow>& rows) {
    std::printf(
        "tcpx-p2p bench engine --kv: a paged KV cache, %s, %d process%s, one request at a "
        "time\n",
        o.interface.c_str(), o.processes, o.processes == 1 ? "" : "es");
    print_kv_shape(o.kv_shape);
    if (o.mem == MemType::kVram) {
        std::printf("memory: GPU (cudaMalloc), the initiator's on GPU %d, the target's on GPU %d\n",
                    o.gpus[0], o.gpus[1]);
    }
    std::printf(
        "engine: %lld channel%s x %lld data sockets, chunk %s, window %lld, %d I/O threads per "
        "endpoint\n",
        static_cast<long long>(c.channels), c.channels == 1 ? "" : "s",
        static_cast<long long>(c.nsocks), format_bytes(c.xfer_chunk_size).c_str(),
        static_cast<long long>(c.window), s.io_threads);
    if (!c.net_plugin.empty()) std::printf("net: ncclNet plugin %s\n", c.net_plugin.c_str());
    print_kv_rows(rows, o.verify);
}

void print_kv_json(const EngineBenchOptions& o, const Config& c, const std::vector<KvRow>& rows) {
    using nlohmann::json;
    json out;
    out["benchmark"] = "engine-kv";
    out["config"] = {{"interface", o.interface},
                     {"processes", o.processes},
                     {"mem", mem_name(o.mem)},
                     {"net_plugin", c.net_plugin},
                     {"channels", c.channels},
                     {"nsocks", c.nsocks},
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
    if (!n.ok()) return Status(n.status()).with_context("--mem vram");
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
    return args;
}

Status run(const EngineBenchOptions& options) {
    EngineBenchOptions o = options;
    // --kv: the contiguous transfer of the same bytes is the baseline.
    if (o.kv) o.baseline = false;
    TCPX_RETURN_IF_ERROR(check_options(o));
    TCPX_RETURN_IF_ERROR(choose_gpus(&o));
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
    std::unique_ptr<Peer> peer;
    if (o.processes == 2) {
        TCPX_ASSIGN_OR_RETURN(peer, ProcessPeer::spawn(serve_args(o)));
    } else {
        TCPX_ASSIGN_OR_RETURN(Config target_config, bench_config(o, kTargetSide));
        peer = std::make_unique<ThreadPeer>([target_config, &o](Channel* ch) {
            Target target(target_config, o.interface);
            (void)target.serve(ch);
        });
    }
    Setup setup;
    setup.io_threads = static_cast<int>(config.io_threads);
    if (setup.io_threads == 0) {
        setup.io_threads =
            static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1U, 16U));
    }
    std::vector<Row> rows;
    std::vector<KvRow> kv_rows;
    {
        EngineInitiator init(o, config, peer.get());
        const CpuClock cpu = [&] { return init.cpu_seconds(); };
        setup.raw_streams = init.raw_streams();
        TCPX_RETURN_IF_ERROR(init.setup().with_context("setting up"));
        std::vector<Op> ops;
        if (o.write) ops.push_back(Op::kWrite);
        if (o.read) ops.push_back(Op::kRead);
        if (o.kv) {
            TCPX_RETURN_IF_ERROR(init.prepare_kv().with_context("--kv: the pools"));
            std::vector<MemType> mems = {o.mem};
            if (host_figures(o)) mems.push_back(MemType::kHost);
            const size_t steps = mems.size() * ops.size() * 2;
            size_t step = 0;
            Progress progress(o.progress && !o.json);
            Calibration cal;
            cal.min_seconds = o.min_seconds;
            cal.min_iters = static_cast<uint64_t>(o.min_iters);
            const uint64_t bytes = o.kv_shape.request_bytes();
            for (MemType mem : mems) {
                for (Op op : ops) {
                    KvRow row;
                    row.op = op_name(op);
                    row.mem = mem_name(mem);
                    for (bool contiguous : {false, true}) {
                        progress.show(++step, steps,
                                      strformat("%s, %s memory, %s", op_name(op), mem_name(mem),
                                                contiguous ? "contiguous" : "KV requests"));
                        Throughput& out = contiguous ? row.contiguous : row.kv;
                        TCPX_ASSIGN_OR_RETURN(out, measure_throughput(
                                                       cal, bytes,
                                                       [&](uint64_t n) {
                                                           return init.kv_transfers(op, mem,
                                                                                    contiguous, n);
                                                       },
                                                       cpu));
                        TCPX_RETURN_IF_ERROR(init.verify_kv(op, mem, contiguous));
                    }
                    row.verified = o.verify;
                    kv_rows.push_back(row);
                }
            }
            progress.clear();
        }
        const bool single = o.peers > 1 && o.single_peer;
        const bool host = host_figures(o);
        const size_t per_op = 1 + (host ? 1 : 0) + (single ? 1 : 0) + (o.baseline ? 1 : 0) +
                              (o.latency ? 1 + (host ? 1 : 0) + (o.baseline ? 1 : 0) : 0);
        const size_t steps = o.sizes.size() * ops.size() * per_op;
        size_t step = 0;
        Progress progress(o.progress && !o.json);
        Calibration lat_cal;
        lat_cal.min_seconds = o.min_seconds;
        lat_cal.min_iters = static_cast<uint64_t>(o.min_iters);
        Calibration cal = lat_cal;
        // One measurement each, with the progress line.
        auto throughput = [&](const std::string& what, uint64_t bytes_per_iter, Throughput* out,
                              const std::function<StatusOr<double>(uint64_t)>& fn) -> Status {
            progress.show(++step, steps, what);
            TCPX_ASSIGN_OR_RETURN(*out, measure_throughput(cal, bytes_per_iter, fn, cpu));
            return Status();
        };
        auto latency =
            [&](const std::string& what, Latency* out,
                const std::function<StatusOr<std::vector<double>>(uint64_t)>& fn) -> Status {
            progress.show(++step, steps, what);
            TCPX_ASSIGN_OR_RETURN(*out, measure_latency(lat_cal, fn));
            return Status();
        };
        const std::string ours_what = strformat("engine (%s)", mem_name(o.mem));
        for (uint64_t size : o.kv ? std::vector<uint64_t>{} : o.sizes) {
            TCPX_RETURN_IF_ERROR(init.prepare(size).with_context(format_bytes(size)));
            // At least one transfer per slot in flight.
            cal.min_iters =
                std::max<uint64_t>(lat_cal.min_iters, static_cast<uint64_t>(init.concurrency()));
            const uint64_t bytes = init.slot_bytes();
            const uint64_t all_bytes = bytes * static_cast<uint64_t>(o.peers);
            for (Op op : ops) {
                Row row;
                row.op = op;
                row.size = size;
                row.concurrency = init.concurrency();
                const std::string what = std::string(op_name(op)) + " " + format_bytes(size);
                TCPX_RETURN_IF_ERROR(
                    throughput(what + ": " + ours_what + ", throughput", all_bytes, &row.ours,
                               [&](uint64_t n) { return init.transfers(op, o.mem, o.peers, n); }));
                if (host) {
                    TCPX_RETURN_IF_ERROR(throughput(what + ": engine (host), throughput", all_bytes,
                                                    &row.host, [&](uint64_t n) {
                                                        return init.transfers(op, MemType::kHost,
                                                                              o.peers, n);
                                                    }));
                }
                if (single) {
                    TCPX_RETURN_IF_ERROR(throughput(
                        what + ": " + ours_what + ", one peer, throughput", bytes, &row.single,
                        [&](uint64_t n) { return init.transfers(op, o.mem, 1, n); }));
                }
                if (o.baseline) {
                    TCPX_RETURN_IF_ERROR(
                        throughput(what + ": raw TCP, throughput", bytes, &row.raw,
                                   [&](uint64_t n) { return init.raw_stream(op, n); }));
                }
                if (o.latency) {
                    TCPX_RETURN_IF_ERROR(
                        latency(what + ": " + ours_what + ", one at a time", &row.ours_lat,
                                [&](uint64_t n) { return init.single_transfers(op, o.mem, n); }));
                    if (host) {
                        TCPX_RETURN_IF_ERROR(latency(what + ": engine (host), one at a time",
                                                     &row.host_lat, [&](uint64_t n) {
                                                         return init.single_transfers(
                                                             op, MemType::kHost, n);
                                                     }));
                    }
                    if (o.baseline) {
                        TCPX_RETURN_IF_ERROR(
                            latency(what + ": raw TCP, ping-pong", &row.raw_lat,
                                    [&](uint64_t n) { return init.raw_pingpong(op, n); }));
                    }
                }
                rows.push_back(row);
            }
        }
        progress.clear();
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
        std::string line;
        while (channel.read_line(&line)) {
            if (line == "quit") {
                channel.write_line("bye");
                return 1;
            }
            channel.write_line("error " + config.status().to_string());
        }
        return 1;
    }
    Target target(*config, options.interface);
    Status st = target.serve(&channel);
    return st.ok() ? 0 : 1;
}

}  // namespace tcpx::bench
