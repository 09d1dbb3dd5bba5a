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
#include "bench/engine_bench.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// What --verify writes over a destination before the transfer that should overwrite it.
constexpr uint8_t kPoison = 0xee;

enum class Op { kWrite, kRead };

const char* op_name(Op op) { return op == Op::kWrite ? "WRITE" : "READ"; }

StatusOr<Config> bench_config(const EngineBenchOptions& o) {
    TCPX_ASSIGN_OR_RETURN(Config c, Config::from_env());
    TCPX_RETURN_IF_ERROR(c.set("SOCKET_IFNAME", o.interface).with_context("--interface"));
    if (!o.channels.empty()) TCPX_RETURN_IF_ERROR(c.set("CHANNELS", o.channels));
    if (!o.nsocks.empty()) TCPX_RETURN_IF_ERROR(c.set("NSOCKS", o.nsocks));
    if (!o.chunk.empty()) TCPX_RETURN_IF_ERROR(c.set("XFER_CHUNK_SIZE", o.chunk));
    if (!o.window.empty()) TCPX_RETURN_IF_ERROR(c.set("WINDOW", o.window));
    TCPX_RETURN_IF_ERROR(c.validate());
    return c;
}

// --- patterns for --verify ---------------------------------------------------------------------

uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

// The pattern of measurement `run` for peer `peer`.
uint64_t pattern_seed(uint64_t run, int peer) {
    return mix64(run * 0x100000001b3ULL + static_cast<uint64_t>(peer));
}

uint8_t pattern_byte(uint64_t seed, uint64_t i) {
    const uint64_t word = mix64(seed ^ (i / 8));
    return static_cast<uint8_t>(word >> (8 * (i % 8)));
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

// --- memory ------------------------------------------------------------------------------------

// Page-aligned host memory, touched.
class HostBuffer {
 public:
    HostBuffer() = default;
    HostBuffer(const HostBuffer&) = delete;
    HostBuffer& operator=(const HostBuffer&) = delete;
    HostBuffer(HostBuffer&& other) noexcept
        : data_(std::exchange(other.data_, nullptr)), len_(std::exchange(other.len_, 0)) {}
    HostBuffer& operator=(HostBuffer&& other) noexcept {
        if (this != &other) {
            std::free(data_);
            data_ = std::exchange(other.data_, nullptr);
            len_ = std::exchange(other.len_, 0);
        }
        return *this;
    }
    ~HostBuffer() { std::free(data_); }

    static StatusOr<HostBuffer> allocate(uint64_t len, uint8_t fill) {
        constexpr uint64_t kPage = 4096;
        const uint64_t rounded = (std::max<uint64_t>(len, 1) + kPage - 1) / kPage * kPage;
        HostBuffer b;
        b.data_ = static_cast<uint8_t*>(std::aligned_alloc(kPage, rounded));
        if (b.data_ == nullptr) {
            return resource_exhausted(strformat("allocating %s", format_bytes(len).c_str()));
        }
        b.len_ = len;
        std::memset(b.data_, fill, rounded);
        return b;
    }

    uint8_t* data() const { return data_; }
    uint64_t size() const { return len_; }

 private:
    uint8_t* data_ = nullptr;
    uint64_t len_ = 0;
};

// A registered region of at least `len` bytes, kept when it is large enough already.
Status ensure_region(Endpoint* ep, HostBuffer* buf, MemId* mem, uint64_t len) {
    if (buf->size() >= len) return Status();
    if (*mem != 0) {
        TCPX_RETURN_IF_ERROR(ep->dereg(*mem).with_context("deregistering"));
        *mem = 0;
    }
    *buf = HostBuffer();
    TCPX_ASSIGN_OR_RETURN(*buf, HostBuffer::allocate(len, 0x5a));
    TCPX_ASSIGN_OR_RETURN(*mem, ep->reg(buf->data(), len));
    return Status();
}

// --- the target side (the responder) ------------------------------------------------------------

// Commands (one line each, replies "ok" unless said otherwise):
//   endpoints <n>                  creates n endpoints -> "md <hex metadata>..."
//   accept <ms>                    waits until every endpoint has its peer (accept())
//   mem <bytes>                    a registered region of at least `bytes` per endpoint
//                                  -> "mem <hex descriptor>..."
//   prep write|read <run> <off> <len> <n>   before a verified measurement: poisons (write) or
//                                  patterns (read) [off, off + len) of the first n regions
//   check <run> <off> <len> <n>    after one: checks the pattern there (the data of writes)
//   raw-*                          the raw TCP baseline, in the first region's memory
//   quit                           -> "bye"
class Target {
 public:
    Target(Config config, const std::string& interface)
        : config_(std::move(config)), raw_(interface) {}
    ~Target() { close(); }

    Status serve(Channel* ch) {
        const RawTcpResponder::BufferFn raw_buffer = [this](uint64_t bytes) -> StatusOr<uint8_t*> {
            if (regions_.empty() || regions_[0].buf.size() < bytes) {
                return failed_precondition("raw TCP baseline: no region of that size");
            }
            return regions_[0].buf.data();
        };
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
            } else if (w[0] == "endpoints" && w.size() == 2) {
                st = endpoints(std::stoi(w[1]), &reply);
            } else if (w[0] == "accept" && w.size() == 2) {
                st = accept(std::stoll(w[1]));
            } else if (w[0] == "mem" && w.size() == 2) {
                st = mem(std::stoull(w[1]), &reply);
            } else if (w[0] == "prep" && w.size() == 6 && (w[1] == "write" || w[1] == "read")) {
                st = prep(w[1] == "write", std::stoull(w[2]), std::stoull(w[3]), std::stoull(w[4]),
                          std::stoi(w[5]));
            } else if (w[0] == "check" && w.size() == 5) {
                st =
                    check(std::stoull(w[1]), std::stoull(w[2]), std::stoull(w[3]), std::stoi(w[4]));
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
    struct Region {
        HostBuffer buf;
        MemId mem = 0;
    };

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

    Status mem(uint64_t bytes, std::string* reply) {
        if (eps_.empty()) return failed_precondition("mem before endpoints");
        *reply = "mem";
        for (size_t i = 0; i < eps_.size(); ++i) {
            Region& r = regions_[i];
            TCPX_RETURN_IF_ERROR(ensure_region(eps_[i].get(), &r.buf, &r.mem, bytes));
            TCPX_ASSIGN_OR_RETURN(RemoteMem d, eps_[i]->describe(r.mem));
            *reply += " " + hex_blob(d.serialize());
        }
        return Status();
    }

    Status in_range(uint64_t off, uint64_t len, int n) const {
        if (n < 1 || static_cast<size_t>(n) > regions_.size()) {
            return invalid_argument("no such region");
        }
        for (int i = 0; i < n; ++i) {
            const uint64_t size = regions_[static_cast<size_t>(i)].buf.size();
            if (off > size || len > size - off) return out_of_range("outside the region");
        }
        return Status();
    }

    Status prep(bool write, uint64_t run, uint64_t off, uint64_t len, int n) {
        TCPX_RETURN_IF_ERROR(in_range(off, len, n));
        for (int i = 0; i < n; ++i) {
            uint8_t* p = regions_[static_cast<size_t>(i)].buf.data() + off;
            if (write) {
                std::memset(p, kPoison, len);
            } else {
                fill_pattern(p, len, pattern_seed(run, i));
            }
        }
        return Status();
    }

    Status check(uint64_t run, uint64_t off, uint64_t len, int n) {
        TCPX_RETURN_IF_ERROR(in_range(off, len, n));
        for (int i = 0; i < n; ++i) {
            TCPX_RETURN_IF_ERROR(check_pattern(regions_[static_cast<size_t>(i)].buf.data() + off,
                                               len, pattern_seed(run, i),
                                               "target " + std::to_string(i)));
        }
        return Status();
    }

    void close() {
        raw_.close();
        eps_.clear();  // before the memory they may still touch
        regions_.clear();
    }

    Config config_;
    std::vector<Region> regions_;  // declared before eps_: outlives them
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

    // Memory for transfers of batch pieces of `size`: the concurrency that fits, regions here
    // and there, the peer's descriptors.
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
        TCPX_ASSIGN_OR_RETURN(std::string reply, peer_->call("mem " + std::to_string(region)));
        const auto w = words(reply);
        if (w.size() != peers_.size() + 1 || w[0] != "mem") {
            return protocol_error("peer: " + reply);
        }
        for (size_t i = 0; i < peers_.size(); ++i) {
            PeerState& p = peers_[i];
            std::string blob;
            if (!unhex_blob(w[i + 1], &blob)) return protocol_error("bad descriptor from peer");
            TCPX_ASSIGN_OR_RETURN(p.remote, RemoteMem::parse(blob));
            TCPX_RETURN_IF_ERROR(ensure_region(ep_.get(), &p.local, &p.mem, region));
        }
        return Status();
    }

    int concurrency() const { return conc_; }
    uint64_t slot_bytes() const { return slot_bytes_; }

    // `count` transfers to each of the first `npeers` peers, conc_ in flight per peer; the time
    // until the last one completes.
    StatusOr<double> transfers(Op op, int npeers, uint64_t count) {
        TCPX_RETURN_IF_ERROR(verify_prep(op, npeers));
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
                    TCPX_ASSIGN_OR_RETURN(XferId id, post(op, p, slot));
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
        TCPX_RETURN_IF_ERROR(verify_check(op, npeers));
        return seconds;
    }

    // `count` transfers to the first peer, one at a time: each one's time from post to
    // completion (wait), in microseconds.
    StatusOr<std::vector<double>> single_transfers(Op op, uint64_t count) {
        TCPX_RETURN_IF_ERROR(verify_prep(op, 1));
        std::vector<double> us;
        us.reserve(count);
        for (uint64_t k = 0; k < count; ++k) {
            const int slot = k + 1 < count ? 0 : conc_;
            const auto start = Clock::now();
            TCPX_ASSIGN_OR_RETURN(XferId id, post(op, 0, slot));
            Status st = ep_->wait(id, kStallTimeout);
            if (!st.ok()) {
                return st.with_context(strformat("%s of %s, one at a time", op_name(op),
                                                 format_bytes(slot_bytes_).c_str()));
            }
            us.push_back(seconds_since(start) * 1e6);
        }
        TCPX_RETURN_IF_ERROR(verify_check(op, 1));
        return us;
    }

    // Raw TCP moving the same bytes in the same direction, from / into the same buffers as the
    // first peer's transfers.
    StatusOr<double> raw_stream(Op op, uint64_t count) {
        const uint64_t slots = static_cast<uint64_t>(conc_);
        return raw_.stream(peer_, op == Op::kWrite, slot_bytes_, count, peers_[0].local.data(),
                           slots, slots);
    }

    // The raw request/response closest to one transfer: WRITE = the data there and an
    // acknowledgement back; READ = a request there and the data back.
    StatusOr<std::vector<double>> raw_pingpong(Op op, uint64_t count) {
        const uint64_t out = op == Op::kWrite ? slot_bytes_ : kSmallMessage;
        const uint64_t back = op == Op::kWrite ? kSmallMessage : slot_bytes_;
        return raw_.pingpong(peer_, out, back, count, peers_[0].local.data());
    }

 private:
    struct PeerState {
        PeerId id = 0;
        RemoteMem remote;
        HostBuffer local;
        MemId mem = 0;
    };

    StatusOr<XferId> post(Op op, size_t p, int slot) {
        PeerState& ps = peers_[p];
        const uint64_t base = static_cast<uint64_t>(slot) * slot_bytes_;
        StatusOr<XferId> id = Status(StatusCode::kInternal, "not posted");
        if (o_.batch == 1) {
            id = op == Op::kWrite ? ep_->write(ps.id, ps.mem, base, ps.remote, base, size_)
                                  : ep_->read(ps.id, ps.mem, base, ps.remote, base, size_);
        } else {
            iov_.resize(static_cast<size_t>(o_.batch));
            for (size_t i = 0; i < iov_.size(); ++i) {
                const uint64_t off = base + i * size_;
                iov_[i] = IoVec{ps.mem, off, ps.remote, off, size_};
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
    Status verify_prep(Op op, int npeers) {
        if (!o_.verify) return Status();
        ++run_;
        const uint64_t off = static_cast<uint64_t>(conc_) * slot_bytes_;
        for (int i = 0; i < npeers; ++i) {
            uint8_t* p = peers_[static_cast<size_t>(i)].local.data() + off;
            if (op == Op::kWrite) {
                fill_pattern(p, slot_bytes_, pattern_seed(run_, i));
            } else {
                std::memset(p, kPoison, slot_bytes_);
            }
        }
        return peer_
            ->call(strformat("prep %s %llu %llu %llu %d", op == Op::kWrite ? "write" : "read",
                             static_cast<unsigned long long>(run_),
                             static_cast<unsigned long long>(off),
                             static_cast<unsigned long long>(slot_bytes_), npeers))
            .status();
    }

    Status verify_check(Op op, int npeers) {
        if (!o_.verify) return Status();
        const uint64_t off = static_cast<uint64_t>(conc_) * slot_bytes_;
        const std::string what = strformat("%s of %s (batch %d), last transfer", op_name(op),
                                           format_bytes(size_).c_str(), o_.batch);
        if (op == Op::kWrite) {
            auto reply = peer_->call(
                strformat("check %llu %llu %llu %d", static_cast<unsigned long long>(run_),
                          static_cast<unsigned long long>(off),
                          static_cast<unsigned long long>(slot_bytes_), npeers));
            if (reply.ok()) return Status();
            // The target's message (after "peer: INTERNAL: ") says where.
            std::string why(reply.status().message());
            const size_t at = why.find("target ");
            if (at != std::string::npos) why = why.substr(at);
            return internal_error("VERIFICATION FAILED: " + what + ", in " + why);
        }
        for (int i = 0; i < npeers; ++i) {
            Status st =
                check_pattern(peers_[static_cast<size_t>(i)].local.data() + off, slot_bytes_,
                              pattern_seed(run_, i), "from target " + std::to_string(i));
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
    Throughput ours;
    Throughput single;  // one peer, when peers > 1
    Throughput raw;
    Latency ours_lat;
    Latency raw_lat;
};

struct Setup {
    int raw_streams = 0;
    int io_threads = 0;  // per endpoint
};

std::string gbps(const Throughput& t) {
    return t.iters ? strformat("%.2f", t.gbps) : std::string("-");
}

std::string usecs(double v, uint64_t iters) {
    return iters ? strformat("%.1f us", v) : std::string("-");
}

void print_table(const EngineBenchOptions& o, const Config& c, const Setup& s,
                 const std::vector<Row>& rows) {
    const bool multi = o.peers > 1 && o.single_peer;
    std::printf(
        "tcpx-p2p bench engine: transfer engine vs raw TCP, %s, %d process%s, %d peer%s x %d "
        "transfers in flight, batch %d\n",
        o.interface.c_str(), o.processes, o.processes == 1 ? "" : "es", o.peers,
        o.peers == 1 ? "" : "s", o.concurrency, o.batch);
    std::printf(
        "engine: %lld channel%s x %lld data sockets = %d raw streams, chunk %s, window %lld, "
        "inline up to %s, %d I/O threads per endpoint\n",
        static_cast<long long>(c.channels), c.channels == 1 ? "" : "s",
        static_cast<long long>(c.nsocks), s.raw_streams, format_bytes(c.xfer_chunk_size).c_str(),
        static_cast<long long>(c.window), format_bytes(c.xfer_inline_threshold).c_str(),
        s.io_threads);
    std::printf(
        "throughput: GB/s (10^9 B/s) of all peers together; raw: %d TCP streams, each "
        "transfer's bytes split evenly, same buffers\n",
        s.raw_streams);
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
    const std::string npeer = strformat("%d/1", o.peers);
    std::printf("%-5s %9s  %8s %8s %8s", "op", "size", "GB/s", "raw", "ours/raw");
    if (multi) std::printf("  %8s %7s", "1 peer", npeer.c_str());
    std::printf("  %10s %10s %8s  %10s %10s\n", "lat p50", "raw p50", "ours/raw", "lat p99",
                "raw p99");
    bool capped = false;
    for (const Row& r : rows) {
        const bool cap = r.concurrency < o.concurrency;
        capped = capped || cap;
        std::string size = format_bytes(r.size);
        if (o.batch > 1) size = strformat("%dx%s", o.batch, size.c_str());
        std::printf("%-5s %9s%s %8s %8s %8s", op_name(r.op), size.c_str(), cap ? "*" : " ",
                    gbps(r.ours).c_str(), gbps(r.raw).c_str(),
                    ratio(r.ours.gbps, r.raw.gbps).c_str());
        if (multi) {
            std::printf("  %8s %7s", gbps(r.single).c_str(),
                        ratio(r.ours.gbps, r.single.gbps).c_str());
        }
        std::printf("  %10s %10s %8s  %10s %10s\n",
                    usecs(r.ours_lat.p50_us, r.ours_lat.iters).c_str(),
                    usecs(r.raw_lat.p50_us, r.raw_lat.iters).c_str(),
                    ratio(r.ours_lat.p50_us, r.raw_lat.p50_us).c_str(),
                    usecs(r.ours_lat.p99_us, r.ours_lat.iters).c_str(),
                    usecs(r.raw_lat.p99_us, r.raw_lat.iters).c_str());
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
                  {"seconds", t.seconds}};
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
        {"latency", "one transfer, post to completion, nothing else in flight, 1 peer"},
        {"raw_latency", strformat("ping-pong on 1 TCP stream: WRITE = data there, %llu B back; "
                                  "READ = %llu B there, data back",
                                  static_cast<unsigned long long>(kSmallMessage),
                                  static_cast<unsigned long long>(kSmallMessage))}};
    out["results"] = json::array();
    for (const Row& r : rows) {
        const uint64_t bytes = r.size * static_cast<uint64_t>(o.batch);
        json row = {{"op", r.op == Op::kWrite ? "write" : "read"},
                    {"size", r.size},
                    {"batch", o.batch},
                    {"bytes_per_transfer", bytes},
                    {"concurrency", r.concurrency}};
        if (r.ours.iters) row["ours"] = tp(r.ours, o.peers);
        if (r.single.iters) {
            row["single_peer"] = tp(r.single, 1);
            row["peers_ratio"] = r.ours.gbps / r.single.gbps;
        }
        if (r.raw.iters) row["raw"] = tp(r.raw, 1);
        if (r.ours.iters && r.raw.iters) row["throughput_ratio"] = r.ours.gbps / r.raw.gbps;
        if (r.ours_lat.iters) row["ours_latency"] = lat(r.ours_lat);
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

Status check_options(const EngineBenchOptions& o) {
    if (o.sizes.empty()) return invalid_argument("no sizes");
    for (uint64_t s : o.sizes) {
        if (s == 0) return invalid_argument("--sizes: a size of 0");
    }
    if (!o.write && !o.read) return invalid_argument("no operation to measure");
    if (o.processes != 1 && o.processes != 2) return invalid_argument("--procs must be 1 or 2");
    if (o.batch < 1) return invalid_argument("--batch must be at least 1");
    if (o.concurrency < 1) return invalid_argument("--concurrency must be at least 1");
    if (o.peers < 1) return invalid_argument("--peers must be at least 1");
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
    return args;
}

Status run(const EngineBenchOptions& o) {
    TCPX_RETURN_IF_ERROR(check_options(o));
    TCPX_ASSIGN_OR_RETURN(Config config, bench_config(o));
    std::unique_ptr<Peer> peer;
    if (o.processes == 2) {
        TCPX_ASSIGN_OR_RETURN(peer, ProcessPeer::spawn(serve_args(o)));
    } else {
        peer = std::make_unique<ThreadPeer>([config, &o](Channel* ch) {
            Target target(config, o.interface);
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
    {
        EngineInitiator init(o, config, peer.get());
        setup.raw_streams = init.raw_streams();
        TCPX_RETURN_IF_ERROR(init.setup().with_context("setting up"));
        std::vector<Op> ops;
        if (o.write) ops.push_back(Op::kWrite);
        if (o.read) ops.push_back(Op::kRead);
        const bool single = o.peers > 1 && o.single_peer;
        const size_t per_op = 1 + (single ? 1 : 0) + (o.baseline ? 1 : 0) +
                              (o.latency ? 1 + (o.baseline ? 1 : 0) : 0);
        const size_t steps = o.sizes.size() * ops.size() * per_op;
        size_t step = 0;
        Progress progress(o.progress && !o.json);
        Calibration lat_cal;
        lat_cal.min_seconds = o.min_seconds;
        lat_cal.min_iters = static_cast<uint64_t>(o.min_iters);
        for (uint64_t size : o.sizes) {
            TCPX_RETURN_IF_ERROR(init.prepare(size).with_context(format_bytes(size)));
            // At least one transfer per slot in flight.
            Calibration cal = lat_cal;
            cal.min_iters =
                std::max<uint64_t>(cal.min_iters, static_cast<uint64_t>(init.concurrency()));
            const uint64_t bytes = init.slot_bytes();
            for (Op op : ops) {
                Row row;
                row.op = op;
                row.size = size;
                row.concurrency = init.concurrency();
                const std::string what = std::string(op_name(op)) + " " + format_bytes(size);
                progress.show(++step, steps, what + ": engine, throughput");
                TCPX_ASSIGN_OR_RETURN(
                    row.ours, measure_throughput(cal, bytes * static_cast<uint64_t>(o.peers),
                                                 [&](uint64_t count) {
                                                     return init.transfers(op, o.peers, count);
                                                 }));
                if (single) {
                    progress.show(++step, steps, what + ": engine, one peer, throughput");
                    TCPX_ASSIGN_OR_RETURN(row.single,
                                          measure_throughput(cal, bytes, [&](uint64_t count) {
                                              return init.transfers(op, 1, count);
                                          }));
                }
                if (o.baseline) {
                    progress.show(++step, steps, what + ": raw TCP, throughput");
                    TCPX_ASSIGN_OR_RETURN(row.raw,
                                          measure_throughput(cal, bytes, [&](uint64_t count) {
                                              return init.raw_stream(op, count);
                                          }));
                }
                if (o.latency) {
                    progress.show(++step, steps, what + ": engine, one at a time");
                    TCPX_ASSIGN_OR_RETURN(row.ours_lat,
                                          measure_latency(lat_cal, [&](uint64_t count) {
                                              return init.single_transfers(op, count);
                                          }));
                    if (o.baseline) {
                        progress.show(++step, steps, what + ": raw TCP, ping-pong");
                        TCPX_ASSIGN_OR_RETURN(row.raw_lat,
                                              measure_latency(lat_cal, [&](uint64_t count) {
                                                  return init.raw_pingpong(op, count);
                                              }));
                    }
                }
                rows.push_back(row);
            }
        }
        progress.clear();
    }
    if (o.json) {
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
    auto config = bench_config(options);
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
